#!/usr/bin/env bash
# registry.sh - a local image registry for the podman tests (issue 22): Debian's docker-registry with htpasswd auth,
# on loopback only, serving the test image made here (clusters/image.sh build), never one downloaded from a hub.
#
#   clusters/registry.sh up       install docker-registry + apache2-utils (htpasswd) from Debian if missing, write
#                                 its config, start it in the background on 127.0.0.1:$PORT (pid file, log file),
#                                 tell podman the registry is plain HTTP (registries.conf.d drop-in), push the test
#                                 image to it as launch-python:test and launch-python:denied; idempotent
#   clusters/registry.sh down     stop it (its storage is kept: a later `up` pushes nothing new)
#   clusters/registry.sh status   one line; exit 0 only when it answers with the credentials
#
# Everything lives in $DIR (default /var/tmp/launch-registry): config.yml, htpasswd (user `launch`, a random
# password made once, in `password`, root only), auth.json (podman's auth file format, what REGISTRY_AUTH_FILE
# names: `podman login --authfile`), storage/, registry.log (its access log: the tests read it), registry.pid.
# Knobs: LAUNCH_REGISTRY_PORT (default 5055), LAUNCH_REGISTRY_DIR, LAUNCH_TEST_IMAGE (the local image pushed).
set -euo pipefail

PORT=${LAUNCH_REGISTRY_PORT:-5055}
DIR=${LAUNCH_REGISTRY_DIR:-/var/tmp/launch-registry}
ADDR=127.0.0.1:$PORT
USER_NAME=launch
IMAGE=${LAUNCH_TEST_IMAGE:-localhost/launch-python:test}
PUSHED=(launch-python:test launch-python:denied)   # `denied`: only ever pulled with a wrong password
DROPIN=/etc/containers/registries.conf.d/50-launchers-registry.conf
BIN=/usr/bin/docker-registry

log() { echo "registry.sh: $*" >&2; }
die() { log "$*"; exit 1; }

install_pkgs() {
  [[ $(id -u) -eq 0 ]] || die "must run as root"
  local missing=()
  [[ -x $BIN ]] || missing+=(docker-registry)
  command -v htpasswd >/dev/null || missing+=(apache2-utils)
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  flock /tmp/apt.lock sh -c "apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends ${missing[*]} || \
    { apt-get update -q && apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends ${missing[*]}; }" \
    >&2 || die "apt-get install ${missing[*]} failed"
  # the package's own service (init script, :5000 on every interface) is not ours: stopped where it started
  [[ ! -x /etc/init.d/docker-registry ]] || /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
}

write_config() {
  install -d -m 0700 "$DIR" "$DIR/storage"
  [[ -s $DIR/password ]] || (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DIR/password")
  local pw; pw=$(cat "$DIR/password")
  htpasswd -vi "$DIR/htpasswd" "$USER_NAME" <<<"$pw" >/dev/null 2>&1 ||
    htpasswd -ciB "$DIR/htpasswd" "$USER_NAME" <<<"$pw" 2>/dev/null || die "htpasswd failed"
  (umask 077; printf '{"auths": {"%s": {"auth": "%s"}}}\n' "$ADDR" "$(printf '%s:%s' "$USER_NAME" "$pw" | base64 -w0)" \
    >"$DIR/auth.json")
  cat >"$DIR/config.yml" <<EOF
# written by clusters/registry.sh
version: 0.1
log:
  accesslog:
    disabled: false
  level: info
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: $DIR/storage
  delete:
    enabled: true
http:
  addr: $ADDR
auth:
  htpasswd:
    realm: launchers-test
    path: $DIR/htpasswd
EOF
  local text="# written by clusters/registry.sh: the test registry speaks plain HTTP on loopback
[[registry]]
location = \"$ADDR\"
insecure = true"
  if [[ "$(cat "$DROPIN" 2>/dev/null)" != "$text" ]]; then
    install -d -m 0755 "$(dirname "$DROPIN")"
    printf '%s\n' "$text" >"$DROPIN.tmp" && mv "$DROPIN.tmp" "$DROPIN"
  fi
}

running() { [[ -s $DIR/registry.pid ]] && kill -0 "$(cat "$DIR/registry.pid")" 2>/dev/null; }

# 200 from /v2/ with the credentials: the registry is up and the password is the one in auth.json
answers() {
  python3 - "$ADDR" "$USER_NAME" "$DIR/password" <<'EOF' 2>/dev/null
import base64, sys, urllib.request
addr, user, pwfile = sys.argv[1:]
tok = base64.b64encode(f"{user}:{open(pwfile).read().strip()}".encode()).decode()
req = urllib.request.Request(f"http://{addr}/v2/", headers={"Authorization": f"Basic {tok}"})
sys.exit(0 if urllib.request.urlopen(req, timeout=2).status == 200 else 1)
EOF
}

start() {
  running && answers && return 0
  running && kill "$(cat "$DIR/registry.pid")" 2>/dev/null && sleep 0.5
  local t0; t0=$(date +%s.%N)
  # a clean environment: the registry reads every REGISTRY_* variable as a config override (REGISTRY_AUTH_FILE,
  # podman's auth file, would make it refuse its config)
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin setsid "$BIN" serve "$DIR/config.yml" >>"$DIR/registry.log" 2>&1 </dev/null &
  echo $! >"$DIR/registry.pid"
  for _ in $(seq 100); do answers && break; sleep 0.1; done
  answers || { tail -5 "$DIR/registry.log" >&2; die "docker-registry did not answer on $ADDR"; }
  log "docker-registry up on $ADDR (pid $(cat "$DIR/registry.pid")) in $(awk -v a="$t0" -v b="$(date +%s.%N)" \
    'BEGIN{printf "%.2f", b-a}') s; log $DIR/registry.log"
}

push() {
  podman image exists "$IMAGE" || die "$IMAGE is absent: run clusters/image.sh build (make podman) first"
  local ref
  for ref in "${PUSHED[@]}"; do
    podman push --quiet --authfile "$DIR/auth.json" "$IMAGE" "$ADDR/$ref" >/dev/null 2>"$DIR/push.err" ||
      { cat "$DIR/push.err" >&2; die "podman push $ADDR/$ref failed"; }
  done
  log "pushed $IMAGE as ${PUSHED[*]/#/$ADDR/}"
}

cmd_up() { install_pkgs; write_config; start; push; }

cmd_down() {
  if running; then
    kill "$(cat "$DIR/registry.pid")" && log "stopped docker-registry on $ADDR"
  fi
  rm -f "$DIR/registry.pid"
}

cmd_status() {
  if running && answers; then echo "docker-registry on $ADDR (pid $(cat "$DIR/registry.pid")), log $DIR/registry.log"
  else echo "docker-registry on $ADDR: not up (clusters/registry.sh up)"; return 1; fi
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) die "usage: $0 up|down|status" ;;
esac
