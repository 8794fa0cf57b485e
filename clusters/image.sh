#!/usr/bin/env bash
# image.sh - podman and the small local test image for `launch local --container-runtime podman` (issue 22).
#
#   clusters/image.sh install   podman + runc from Debian if missing (apt-get update only then), and podman's
#                               config: runc as its runtime (crun refuses a hybrid cgroup v1/v2 layout)
#   clusters/image.sh build     the image $IMAGE, made here with no download (kept when its content is the same)
#   clusters/image.sh rm        remove the image (nothing else)
#   clusters/image.sh status    one line: podman, runc and the image (id, size, content key); exit 0 only if usable
#   clusters/image.sh bundle DIR   an OCI bundle at DIR (absolute) for Slurm's `srun --container=DIR` (oci.conf:
#                               slurm/dev-cluster.sh): config.json from `runc spec`, edited by clusters/oci_bundle.py
#                               with the job's interpreter ($LAUNCH_BUNDLE_PYTHON, default this checkout's
#                               .venv/bin/python); rootfs/ holds mount points only, this host's /usr, /etc, the
#                               checkout, the interpreter's prefixes, /tmp, /var/tmp, /dev/shm, /run/munge are mounted
#                               at the same paths. Kept when its content (config.json + rootfs listing) is the same,
#                               replaced when it changed; a DIR not made here is never replaced.
#
# The image is a tiny rootfs: merged-/usr symlinks (bin, lib, lib64, sbin -> usr/...), an empty /usr, /etc with
# passwd, group and hosts, /tmp, /root; `podman import` makes it an image. A job mounts this host's /usr, the
# Python prefix of its interpreter and its venv read-only at the same paths (--container-mount SRC:SRC:ro), so
# the venv's python runs inside (tests/test_container_podman.py). The tarball is reproducible (sorted names,
# mtime 0, numeric owner 0): its sha256 is the content key, kept as the image's label launchers.rootfs; `build`
# does nothing when the image has that key, and replaces it when the recipe below changed.
# Knobs: LAUNCH_TEST_IMAGE (default localhost/launch-python:test).
set -euo pipefail

IMAGE=${LAUNCH_TEST_IMAGE:-localhost/launch-python:test}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CHECKOUT=$(dirname "$HERE")
BUNDLE_PYTHON=${LAUNCH_BUNDLE_PYTHON:-$CHECKOUT/.venv/bin/python}
BUNDLE_KEY=launchers-bundle.key         # in a bundle made here: its content key
LABEL=launchers.rootfs
CONF=/etc/containers/containers.conf.d/50-launchers.conf
CONF_TEXT='# written by clusters/image.sh: crun refuses a hybrid cgroup v1/v2 layout; runc runs there too
[engine]
runtime = "runc"'

log() { echo "image.sh: $*" >&2; }
die() { log "$*"; exit 1; }

cmd_install() {
  [[ $(id -u) -eq 0 ]] || die "must run as root"
  local missing=()
  command -v podman >/dev/null || missing+=(podman)
  command -v runc >/dev/null || [[ -x /usr/sbin/runc ]] || missing+=(runc)
  if ((${#missing[@]})); then
    log "installing podman runc (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    flock /tmp/apt.lock sh -c 'apt-get update -q && apt-get install -y -q -o DPkg::Lock::Timeout=600 \
      --no-install-recommends podman runc' >&2 || die "apt-get install podman runc failed"
  fi
  if [[ "$(cat "$CONF" 2>/dev/null)" != "$CONF_TEXT" ]]; then
    install -d -m 0755 "$(dirname "$CONF")"
    printf '%s\n' "$CONF_TEXT" >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
    log "wrote $CONF"
  fi
}

# The rootfs tarball on stdout: the same bytes on every run and every machine.
rootfs_tar() (
  d=$(mktemp -d /tmp/launch-rootfs.XXXXXX)
  trap 'rm -rf "$d"' EXIT
  install -d -m 0755 "$d"/{usr,usr/bin,usr/lib,usr/lib64,usr/sbin,etc,root,proc,sys,dev,run,var}
  install -d -m 1777 "$d/tmp" "$d/var/tmp"
  for l in bin lib lib64 sbin; do ln -s "usr/$l" "$d/$l"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$d/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$d/etc/group"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$d/etc/hosts"
  chmod 0644 "$d"/etc/*
  tar -C "$d" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - .
)

image_key() { podman image inspect --format "{{ index .Labels \"$LABEL\" }}" "$IMAGE" 2>/dev/null || true; }

cmd_build() {
  command -v podman >/dev/null || die "podman is not installed: run clusters/image.sh install (make podman)"
  local t0 tar key; t0=$(date +%s.%N)
  tar=$(mktemp /tmp/launch-rootfs.XXXXXX.tar)
  rootfs_tar >"$tar" || { rm -f "$tar"; die "could not make the rootfs tarball"; }
  key=$(sha256sum "$tar" | cut -c1-16)
  if [[ $(image_key) == "$key" ]]; then
    rm -f "$tar"
    log "$IMAGE is up to date (rootfs $key)"
    return 0
  fi
  local old; old=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  podman import --quiet --change "LABEL $LABEL=$key" --change "ENV PATH=/usr/local/bin:/usr/bin:/bin" \
    --message "launchers test rootfs $key" "$tar" "$IMAGE" >/dev/null || { rm -f "$tar"; die "podman import failed"; }
  rm -f "$tar"
  [[ -z $old ]] || podman rmi "$old" >/dev/null 2>&1 || true     # an older recipe's image, unless still in use
  log "built $IMAGE (rootfs $key) in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
}

cmd_rm() {
  command -v podman >/dev/null || return 0
  podman image exists "$IMAGE" && podman rmi --force "$IMAGE" >/dev/null && log "removed $IMAGE" || true
}

cmd_status() {
  local ok=0
  command -v podman >/dev/null || { echo "podman: not installed"; ok=1; }
  command -v runc >/dev/null || [[ -x /usr/sbin/runc ]] || { echo "runc: not installed"; ok=1; }
  if ((ok == 0)) && podman image exists "$IMAGE"; then
    podman image inspect --format "$IMAGE {{.Id}} {{.Size}} bytes, rootfs {{ index .Labels \"$LABEL\" }}" "$IMAGE" \
      | cut -c1-200
  else
    echo "$IMAGE: absent (clusters/image.sh build)"; ok=1
  fi
  return $ok
}

runc_bin() { command -v runc 2>/dev/null || { [[ -x /usr/sbin/runc ]] && echo /usr/sbin/runc; }; }

cmd_bundle() {
  local dir=${1:-} runc new key
  [[ $dir == /* && $dir != */ && $dir != *..* ]] || die "bad bundle DIR '${dir}': an absolute path (no trailing /, no ..) is accepted"
  runc=$(runc_bin) || die "runc is not installed: run clusters/image.sh install (make podman)"
  [[ -x $BUNDLE_PYTHON ]] || die "no interpreter at $BUNDLE_PYTHON: make venv, or set LAUNCH_BUNDLE_PYTHON"
  [[ ! -e $dir || -e $dir/$BUNDLE_KEY ]] || die "$dir exists and is no bundle made here; remove it or choose another DIR"
  mkdir -p "$(dirname "$dir")"
  new=$(mktemp -d "$dir.new.XXXXXX")
  (cd "$new" && "$runc" spec) && "$BUNDLE_PYTHON" "$HERE/oci_bundle.py" "$new" "$CHECKOUT" \
    || { rm -rf "$new"; die "could not make the bundle"; }
  key=$(cd "$new" && { cat config.json; find rootfs -printf '%p %y %m %l\n' | LC_ALL=C sort; } | sha256sum | cut -c1-16)
  if [[ $(cat "$dir/$BUNDLE_KEY" 2>/dev/null) == "$key" ]]; then
    rm -rf "$new"; log "bundle $dir is up to date ($key)"; return 0
  fi
  echo "$key" >"$new/$BUNDLE_KEY"
  chmod 0755 "$new"
  rm -rf "$dir" && mv "$new" "$dir"
  log "built bundle $dir ($key)"
}

case "${1:-}" in
  install) cmd_install ;;
  build) cmd_build ;;
  rm) cmd_rm ;;
  status) cmd_status ;;
  bundle) cmd_bundle "${2:-}" ;;
  *) die "usage: $0 install|build|rm|status|bundle DIR" ;;
esac
