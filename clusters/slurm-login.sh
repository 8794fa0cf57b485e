#!/usr/bin/env bash
# slurm-login.sh - login nodes and a bastion in front of the dev Slurm cluster (slurm/dev-cluster.sh), and a client
# that reaches them only through the bastion: `launch ... --cluster NAME` (issue 25) tried the way a laptop does it.
#
#   clusters/slurm-login.sh up             start login nodes, bastion and client namespace; write clusters.yaml
#   clusters/slurm-login.sh down           stop everything `up` started; leaves nothing behind
#   clusters/slurm-login.sh status         one line per host; exit 0 only if each answers ssh through the bastion
#   clusters/slurm-login.sh client CMD...  run CMD in the client's namespace (it reaches the bastion only)
#   clusters/slurm-login.sh cut-login K    login node K's link goes down (packets dropped: a cluster not answering)
#   clusters/slurm-login.sh revive-login K its link back up
#
# Login node k: netns llogin<k>, hostname slurmlogin<k>, 10.215.0.(50+k) on the dev cluster's bridge lsimbr0, so it
# reaches slurmctld like any node; Slurm's client configuration (/etc/slurm, munge's socket) and the project's files
# are the shared filesystem's. It runs sshd and no slurmd. The bastion (netns lbastion, hostname bastion) has two
# links: 10.215.0.60 on lsimbr0 and 10.218.0.2 on bridge lclibr0; it does not route (no ip_forward in its netns), so
# the client (netns lclient, 10.218.0.10 on lclibr0, nothing else) reaches a login node only by ssh through it.
# Clusters file ($STATE/clusters.yaml): `dev` = login node 1, `dev2` = login node 2 (the same Slurm daemons under
# another name), both jumping through the bastion, host keys in $STATE/known_hosts (verified, never accepted).
# Knobs: LAUNCH_LOGIN_STATE (default /run/launch-slurm-login), LAUNCH_LOGIN_LAUNCH (the login nodes' `launch`
# command, default this checkout's .venv/bin/launch), LAUNCH_LOGIN_RUNS (runs root on the shared storage, default
# /var/tmp/launch-cluster-runs). Never kills by name: by pid file or `ip netns pids`.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${LAUNCH_LOGIN_STATE:-/run/launch-slurm-login}
LAUNCH_CMD=${LAUNCH_LOGIN_LAUNCH:-$HERE/.venv/bin/launch}
# (clusters.yaml runs it with LAUNCH_WARM=0: a dev cluster torn down after the tests leaves no warm launcher behind)
RUNS=${LAUNCH_LOGIN_RUNS:-/var/tmp/launch-cluster-runs}
N=2
SIM_BR=lsimbr0
SIM_NET=10.215.0
CLI_BR=lclibr0
CLI_NET=10.218.0
SSHD=/usr/sbin/sshd
LOCK=/run/lock/launch-slurm-login.lock

log() { printf '[slurm-login] %s\n' "$*" >&2; }
die() { printf 'slurm-login: error: %s\n' "$*" >&2; exit 2; }
case $STATE in /run/?*|/var/tmp/?*) ;; *) die "LAUNCH_LOGIN_STATE='$STATE': accepted: a directory under /run or /var/tmp";; esac

# host table: name netns hostname; addresses below
hosts() { echo "login1 login2 bastion"; }
ns_of() { case $1 in login*) echo "llogin${1#login}";; bastion) echo lbastion;; client) echo lclient;; esac; }
hostname_of() { case $1 in login*) echo "slurmlogin${1#login}";; *) echo "$1";; esac; }
addr_of() { case $1 in login*) echo "$SIM_NET.$((50 + ${1#login}))";; bastion) echo "$CLI_NET.2";; client) echo "$CLI_NET.10";; esac; }

alive() { local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1; [[ -n $st && $st != Z ]]; }
ns_pids() { ip netns pids "$1" 2>/dev/null || true; }

link() {  # link NS IFNAME BRIDGE ADDR: a veth from bridge BRIDGE into NS as IFNAME with ADDR/24
  local ns=$1 ifn=$2 br=$3 addr=$4 v="v$1$2"
  v=${v:0:15}
  [[ -e /run/netns/$ns ]] || ip netns add "$ns"
  ip link show "$v" >/dev/null 2>&1 || ip link add "$v" type veth peer name "$ifn" netns "$ns"
  ip link set "$v" master "$br" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr replace "$addr/24" dev "$ifn"
  ip -n "$ns" link set "$ifn" up
}

bashrc_copy() {  # root's ~/.bashrc without `pyenv init` (clusters/host-bashrc.sh: its rehash lock), to mount
  "$HERE/clusters/host-bashrc.sh" "$STATE/bashrc"
  [[ -f $STATE/bashrc ]] || return 0
  echo "mount --bind '$STATE/bashrc' '$(getent passwd root | cut -d: -f6)/.bashrc'"
}

sshd_up() {  # sshd_up HOST: its config, host key and sshd in its netns (own UTS and mount namespace)
  local h=$1 d=$STATE/$1 ns pid p mounts
  ns=$(ns_of "$h")
  install -d -m 0700 "$d"
  [[ -f $d/key ]] || ssh-keygen -q -t ed25519 -N '' -C "$h-hostkey" -f "$d/key"
  cat > "$d/sshd_config" <<EOF
ListenAddress 0.0.0.0:22
HostKey $d/key
PidFile none
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PrintMotd no
MaxStartups 100:30:200
MaxSessions 64
ClientAliveInterval 5
ClientAliveCountMax 3
AllowTcpForwarding $([[ $h == bastion ]] && echo yes || echo no)
EOF
  "$SSHD" -t -f "$d/sshd_config" || die "sshd rejects $d/sshd_config"
  [[ -s $d/sshd.pid ]] && alive "$(cat "$d/sshd.pid")" && return 0
  mounts=$(bashrc_copy)
  setsid ip netns exec "$ns" unshare --uts --mount --propagation private sh -ec "
    hostname '$(hostname_of "$h")'
    $mounts
    exec '$SSHD' -D -f '$d/sshd_config' -E '$d/sshd.log'" </dev/null >>"$d/sshd.log" 2>&1 9>&- &
  pid=
  for _ in $(seq 1 50); do
    for p in $(ns_pids "$ns"); do
      tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$SSHD -D -f $d/sshd_config " && { pid=$p; break 2; }
    done
    sleep 0.1
  done
  [[ -n $pid ]] || die "sshd of $h did not start (see $d/sshd.log)"
  echo "$pid" > "$d/sshd.pid"
  log "sshd of $h ($(hostname_of "$h")) in netns $ns, pid $pid"
}

write_client_files() {  # known_hosts (the bastion by its client-side address, the login nodes) and clusters.yaml
  local h k
  for h in $(hosts); do echo "$(addr_of "$h") $(cut -d' ' -f1,2 "$STATE/$h/key.pub")"; done > "$STATE/known_hosts"
  { echo "# written by clusters/slurm-login.sh: the dev Slurm cluster's login nodes, through the bastion"
    for k in $(seq 1 "$N"); do
      cat <<EOF
dev$( ((k > 1)) && echo "$k"):
  login: $(addr_of "login$k")
  user: root
  identity: client_key
  jump: [root@$(addr_of bastion)]
  known_hosts: known_hosts
  runs_root: $RUNS
  launch: env LAUNCH_WARM=0 $LAUNCH_CMD
EOF
    done; } > "$STATE/clusters.yaml"
  install -d -m 0755 "$RUNS"
  # the client's tools: no Slurm binary (PATH=$STATE/client-bin)
  install -d -m 0755 "$STATE/client-bin"
  for t in ssh tar git gzip sh bash env cat ls rm mkdir mktemp sleep true hostname sha256sum python3 id; do
    p=$(command -v "$t") && ln -sfn "$p" "$STATE/client-bin/$t"
  done
}

ssh_ok() {  # ssh_ok LOGIN: the client reaches it through the bastion, host keys verified
  ip netns exec lclient ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$STATE/known_hosts" \
    -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=3 -i "$STATE/client_key" -o IdentitiesOnly=yes \
    -o ProxyCommand="ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=$STATE/known_hosts -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=3 -i $STATE/client_key -o IdentitiesOnly=yes -W %h:%p root@$(addr_of bastion)" \
    "root@$(addr_of "$1")" hostname 2>/dev/null
}

cmd_up() {
  local h k
  [[ $(id -u) -eq 0 ]] || die "must run as root"
  ip link show "$SIM_BR" >/dev/null 2>&1 || die "bridge $SIM_BR is missing: the dev Slurm cluster is not up (make slurm-up)"
  for b in "$SSHD" ssh ssh-keygen unshare; do command -v "$b" >/dev/null || die "missing program $b"; done
  [[ -d /run/sshd ]] || install -d -m 0755 /run/sshd
  install -d -m 0700 "$STATE"
  [[ -f $STATE/client_key ]] || ssh-keygen -q -t ed25519 -N '' -C launch-slurm-login-client -f "$STATE/client_key"
  install -m 0600 "$STATE/client_key.pub" "$STATE/authorized_keys"
  ip link show "$CLI_BR" >/dev/null 2>&1 || { ip link add "$CLI_BR" type bridge; log "created bridge $CLI_BR (no address here)"; }
  ip link set "$CLI_BR" up
  for k in $(seq 1 "$N"); do link "$(ns_of "login$k")" eth0 "$SIM_BR" "$(addr_of "login$k")"; done
  link lbastion eth0 "$SIM_BR" "$SIM_NET.60"
  link lbastion eth1 "$CLI_BR" "$(addr_of bastion)"
  ip netns exec lbastion sysctl -q -w net.ipv4.ip_forward=0
  link lclient eth0 "$CLI_BR" "$(addr_of client)"
  for h in $(hosts); do sshd_up "$h"; done
  write_client_files
  for k in $(seq 1 "$N"); do
    for _ in $(seq 1 50); do [[ $(ssh_ok "login$k") == "slurmlogin$k" ]] && continue 2; sleep 0.1; done
    die "login$k not reachable through the bastion (see $STATE/*/sshd.log)"
  done
  log "up: login nodes $(for k in $(seq 1 "$N"); do printf '%s ' "$(addr_of "login$k")"; done)behind bastion $(addr_of bastion); clusters file $STATE/clusters.yaml"
  echo "$STATE/clusters.yaml"
}

cmd_down() {
  local h ns pids
  for h in $(hosts) client; do
    ns=$(ns_of "$h")
    if [[ -e /run/netns/$ns ]]; then
      mapfile -t pids < <(ns_pids "$ns")
      if (( ${#pids[@]} )); then kill -TERM "${pids[@]}" 2>/dev/null || true; sleep 0.3; kill -KILL "${pids[@]}" 2>/dev/null || true; fi
      ip netns del "$ns" && log "deleted netns $ns"
    fi
  done
  if ip link show "$CLI_BR" >/dev/null 2>&1; then ip link del "$CLI_BR" && log "deleted bridge $CLI_BR"; fi
  [[ -d $STATE ]] && rm -rf -- "$STATE" && log "removed $STATE"
  return 0
}

cmd_status() {
  local k ok=0 got
  [[ -f $STATE/clusters.yaml ]] || { echo "not up (run: clusters/slurm-login.sh up)"; return 1; }
  for k in $(seq 1 "$N"); do
    got=$(ssh_ok "login$k" || true)
    printf 'login%s %-12s via bastion %s: %s\n' "$k" "$(addr_of "login$k")" "$(addr_of bastion)" "${got:-DOWN}"
    [[ $got == "slurmlogin$k" ]] || ok=1
  done
  return $ok
}

login_arg() { [[ ${1:-} =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= N )) || die "login node '${1:-}': accepted 1..$N"; echo "$1"; }

cmd=${1:-}; shift || true
exec 9>"$LOCK"
case $cmd in
  up) flock 9; cmd_up ;;
  down) flock 9; cmd_down ;;
  status) cmd_status ;;
  client) exec 9>&-; exec ip netns exec lclient "$@" ;;
  cut-login) k=$(login_arg "${1:-}"); ip -n "$(ns_of "login$k")" link set eth0 down; log "login$k cut off" ;;
  revive-login) k=$(login_arg "${1:-}"); ip -n "$(ns_of "login$k")" link set eth0 up; log "login$k back" ;;
  *) die "unknown command '${cmd}'; accepted: up, down, status, client CMD..., cut-login K, revive-login K" ;;
esac
