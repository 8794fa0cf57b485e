#!/usr/bin/env bash
# dev-cluster.sh - a real Slurm cluster (slurmctld + N slurmd) on ONE Debian machine, for tests and experiments.
#
#   sudo slurm/dev-cluster.sh up       install slurm-wlm + munge if missing, start everything, wait until every
#                                      node is idle, print sinfo. Idempotent: starts only what is missing.
#   sudo slurm/dev-cluster.sh down     cancel jobs, stop what `up` started (by pid), delete namespaces, bridge,
#                                      /etc/hosts block, configs and the state directory. Safe after a partial up.
#        slurm/dev-cluster.sh status   what is running; exit 0 only if the whole cluster is up.
#   sudo slurm/dev-cluster.sh kill-node K   crash node lnodeK: SIGKILL its slurmd and every process in its
#                                      namespace (job steps, tasks), by pid. slurmctld notices after
#                                      LSIM_SLURMD_TIMEOUT s (node DOWN, its jobs NODE_FAIL); `up` revives it.
#
# Each node lnodeK is a network namespace with its own address (10.215.0.1K on bridge lsimbr0) and, through
# its own UTS namespace, its own hostname; its slurmd and every job step it forks live there, so multi-node
# torchrun traffic really crosses the bridge. The filesystem is shared (only net and uts are unshared): run
# directories and the venv are visible on every node. Each node offers gres gpu:8 backed by character devices
# (clones of /dev/null), so --gpus-per-node 8 is accepted and CUDA_VISIBLE_DEVICES is set. No slurmdbd.
# Slurm's OCI support is on (oci.conf): `srun --container=BUNDLE` runs each node's task with runc as root, its state
# under /run/lsim-oci (a bundle: clusters/image.sh bundle DIR); down deletes what is left there.
#
# Knobs (environment): LSIM_DIR [/var/tmp/lsim]  LSIM_NODES [4]  LSIM_CPUS [8]  LSIM_MEM_MB [4096]
#   LSIM_GPUS [8]  LSIM_PARTITION [gpu]  LSIM_SUBNET [10.215.0]  LSIM_CRED_EXPIRE [10]  LSIM_SLURMD_TIMEOUT [30]
#   LSIM_WAIT [90] (seconds up waits for idle nodes)  LSIM_INSTALL [1] (0: never apt-get)  LSIM_KEEP [0] (down
#   keeps the state dir and logs). Changing LSIM_NODES or the subnet needs down, then up.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${LSIM_DIR:-/var/tmp/lsim}
NODES=${LSIM_NODES:-4}
CPUS=${LSIM_CPUS:-8}
MEM_MB=${LSIM_MEM_MB:-4096}
GPUS=${LSIM_GPUS:-8}
PARTITION=${LSIM_PARTITION:-gpu}
SUBNET=${LSIM_SUBNET:-10.215.0}
CRED_EXPIRE=${LSIM_CRED_EXPIRE:-10}
SLURMD_TIMEOUT=${LSIM_SLURMD_TIMEOUT:-30}
WAIT_S=${LSIM_WAIT:-90}

MARK=launchers-dev-slurm          # marks every file we own (configs, /etc/hosts block, state dir)
BRIDGE=lsimbr0
CTL_HOST=lsimctl
CTL_ADDR=$SUBNET.1
CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
OCI_CONF=/etc/slurm/oci.conf
OCI_ROOT=/run/lsim-oci            # runc's state dir for the steps' containers (tmpfs: gone with a reboot, as runc expects)
SACCT_LINK=/usr/local/bin/sacct
LOCK=/run/lock/lsim-dev-cluster.lock

T0=$(date +%s%3N)
log() { local ms=$(($(date +%s%3N) - T0)); printf '[lsim %d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"; }
die() { echo "dev-cluster.sh: error: $*" >&2; exit 1; }

node() { echo "lnode$1"; }              # node name = hostname = netns name
node_addr() { echo "$SUBNET.$((10 + $1))"; }
veth() { echo "lsimv$1"; }

# ------------------------------------------------------------------------------------------ pids
# Every daemon is started in the foreground (-D / -F) in the background of this script, so $! is the daemon
# itself; its pid goes to $DIR/run/<name>.pid (slurm writes the same pid to the same file). We only ever
# signal a pid from such a file, and only while /proc/<pid>/comm still names the daemon we started.
alive() {  # alive PID: some thread of PID is not a zombie. Neither kill -0 nor the main thread's state will
  # do: PID 1 here reaps late, and a daemon's main thread may exit before its other threads.
  local t s
  for t in /proc/"$1"/task/*/stat; do   # "tid (comm) STATE ..."; a thread may vanish while we look
    read -r s 2>/dev/null <"$t" || continue
    s=${s##*) }
    [ "${s%% *}" = Z ] || return 0
  done
  return 1
}

pid_of() {  # pid_of NAME COMM -> prints the live pid, or fails
  local f=$DIR/run/$1.pid pid
  [ -s "$f" ] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  echo "$pid"
}

start_daemon() {  # start_daemon NAME COMMAND...: background, own session, no inherited stdio or lock fd
  setsid "${@:2}" </dev/null >>"$DIR/log/$1.stdio" 2>&1 9>&- &
  echo $! >"$DIR/run/$1.pid"
}

stop_pids() {  # stop_pids WHAT GRACE PID...: SIGTERM, wait up to GRACE seconds, then SIGKILL
  local what=$1 grace=$2 pid live; shift 2
  [ $# -gt 0 ] || return 0
  log "stopping $what (pid $*)"
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq $((grace * 10))); do
    live=0
    for pid in "$@"; do alive "$pid" && live=1; done
    [ $live = 1 ] || return 0
    sleep 0.1
  done
  log "$what still alive after $grace s: SIGKILL"
  kill -KILL "$@" 2>/dev/null || true
}

our_netns() { ip netns list 2>/dev/null | awk '$1 ~ /^lnode[0-9]+$/ {print $1}'; }
netns_pids() { local ns; for ns in $(our_netns); do ip netns pids "$ns" 2>/dev/null; done | paste -sd' ' -; }

# ------------------------------------------------------------------------------------------ up
check_knobs() {
  local k v
  for k in NODES CPUS MEM_MB GPUS CRED_EXPIRE SLURMD_TIMEOUT WAIT_S; do
    v=${!k}
    [[ $v =~ ^[1-9][0-9]*$ ]] || die "bad value '$v' for LSIM_${k%_S}: a positive integer is accepted"
  done
  [ "$NODES" -le 64 ] || die "bad value '$NODES' for LSIM_NODES: 1..64 is accepted"
  [ "$CRED_EXPIRE" -ge 5 ] || die "bad value '$CRED_EXPIRE' for LSIM_CRED_EXPIRE: 5 or more is accepted"
  [[ $SUBNET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "bad value '$SUBNET' for LSIM_SUBNET: three octets (10.215.0) are accepted"
  [[ $PARTITION =~ ^[A-Za-z0-9_-]+$ ]] || die "bad value '$PARTITION' for LSIM_PARTITION: letters, digits, _ and - are accepted"
}

install_packages() {
  local missing=() b
  for b in slurmctld slurmd sbatch sinfo munged munge unmunge ip nsenter unshare setpriv ss; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  [ "${LSIM_INSTALL:-1}" = 1 ] || die "missing ${missing[*]}: apt-get install slurm-wlm munge iproute2 util-linux (or leave LSIM_INSTALL unset: up installs them)"
  log "installing slurm-wlm munge iproute2 util-linux (missing: ${missing[*]})"
  local apt=(flock /tmp/apt.lock apt-get -y -q -o DPkg::Lock::Timeout=600)
  export DEBIAN_FRONTEND=noninteractive
  "${apt[@]}" install slurm-wlm munge iproute2 util-linux >"$DIR/log/apt.log" 2>&1 \
    || { "${apt[@]}" update >>"$DIR/log/apt.log" 2>&1 && "${apt[@]}" install slurm-wlm munge iproute2 util-linux >>"$DIR/log/apt.log" 2>&1; } \
    || { tail -5 "$DIR/log/apt.log" >&2; die "apt-get install failed; see $DIR/log/apt.log"; }
  log "installed $(dpkg-query -W -f='slurm-wlm ${Version}' slurm-wlm), $(dpkg-query -W -f='munge ${Version}' munge)"
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  if munge_ok; then return 0; fi   # a munged we did not start is used, never stopped
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    install -d -o munge -g munge -m 700 /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
  # as the munge user (as root munged refuses: "PRNG seed dir is insecure"); setpriv execs, so $! is munged
  log "starting munged"
  start_daemon munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground
  for _ in $(seq 50); do munge_ok && return 0; sleep 0.1; done
  die "munged does not answer; see $DIR/log/munged.stdio and /var/log/munge/munged.log"
}

setup_network() {
  local k ns v addr
  ip link show "$BRIDGE" >/dev/null 2>&1 || { log "creating bridge $BRIDGE $CTL_ADDR/24"; ip link add "$BRIDGE" type bridge; }
  [[ $(ip -4 -o addr show dev "$BRIDGE") == *" $CTL_ADDR/24 "* ]] || ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for k in $(seq "$NODES"); do
    ns=$(node "$k"); v=$(veth "$k"); addr=$(node_addr "$k")
    if [ -e "/run/netns/$ns" ] && ! ip -n "$ns" link show lo >/dev/null 2>&1; then
      log "removing broken netns entry $ns (an interrupted ip netns add)"; ip netns del "$ns" 2>/dev/null || rm -f "/run/netns/$ns"
    fi
    [ -e "/run/netns/$ns" ] || { log "creating netns $ns ($addr)"; ip netns add "$ns"; }
    ip link show "$v" >/dev/null 2>&1 || ip link add "$v" type veth peer name eth0 netns "$ns"
    ip link set "$v" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    [[ $(ip -n "$ns" -4 -o addr show dev eth0) == *" $addr/24 "* ]] || ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

write_hosts() {  # a marked block in /etc/hosts: the controller and every node
  local k block="# BEGIN $MARK"$'\n'"$CTL_ADDR $CTL_HOST"
  for k in $(seq "$NODES"); do block+=$'\n'"$(node_addr "$k") $(node "$k")"; done
  block+=$'\n'"# END $MARK"
  [ "$(sed -n "/^# BEGIN $MARK\$/,/^# END $MARK\$/p" /etc/hosts)" = "$block" ] && return 0
  sed -i "/^# BEGIN $MARK\$/,/^# END $MARK\$/d" /etc/hosts
  printf '%s\n' "$block" >>/etc/hosts
}

install_file() {  # install_file NEW DEST: back up a foreign DEST once; returns 0 if DEST changed
  if [ -e "$2" ] && ! grep -q "$MARK" "$2" && [ ! -e "$2.pre-$MARK" ]; then mv "$2" "$2.pre-$MARK"; fi
  if cmp -s "$1" "$2"; then rm -f "$1"; return 1; fi
  mv "$1" "$2"
}

runc_bin() { command -v runc 2>/dev/null || echo /usr/sbin/runc; }   # clusters/image.sh install puts it there

# oci.conf(5) of Slurm 22.05: RunTimeRun (runc run in the foreground: the task's stdio, its exit status, signals
# passed on to the container, every process a descendant of slurmstepd) with Query/Kill/Delete, which slurmstepd
# runs after the step to remove a container that runc run left (runc SIGKILLed). One task per node and step, so
# job.step.node names a container uniquely across the nodes (they share /run).
write_oci_conf() {
  local r id="lsim-%j.%s.%n"
  r="$(runc_bin) --root $OCI_ROOT"
  {
    echo "# $MARK: Slurm's OCI support (srun --container=BUNDLE), rendered by slurm/dev-cluster.sh"
    echo "RunTimeQuery=\"$r state $id\""
    echo "RunTimeKill=\"$r kill --all $id KILL\""
    echo "RunTimeDelete=\"$r delete --force $id\""
    echo "RunTimeRun=\"$r run --bundle %b $id\""
  } >"$DIR/oci.conf.new"
  install_file "$DIR/oci.conf.new" "$OCI_CONF" || true   # slurmstepd reads it at each step: no reconfigure
}

write_configs() {  # -> CONF_CHANGED=1 when slurm.conf or gres.conf changed
  local k i last=$((GPUS - 1))
  mkdir -p /etc/slurm "$DIR/dev"
  for i in $(seq 0 "$last"); do   # must be character devices, else slurmd ignores them (no CUDA_VISIBLE_DEVICES)
    [ -c "$DIR/dev/nvidia$i" ] || { rm -f "$DIR/dev/nvidia$i"; mknod -m 666 "$DIR/dev/nvidia$i" c 1 3; }
  done
  {
    sed -e "s|@CTL_HOST@|$CTL_HOST|g; s|@CTL_ADDR@|$CTL_ADDR|g; s|@DIR@|$DIR|g" \
        -e "s|@CRED_EXPIRE@|$CRED_EXPIRE|g; s|@SLURMD_TIMEOUT@|$SLURMD_TIMEOUT|g" "$HERE/slurm.conf.in"
    for k in $(seq "$NODES"); do
      echo "NodeName=$(node "$k") NodeHostname=$(node "$k") NodeAddr=$(node_addr "$k") CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPUS State=UNKNOWN"
    done
    echo "PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } >"$DIR/slurm.conf.new"
  {
    echo "# $MARK: fake GPUs (character devices cloned from /dev/null)"
    echo "AutoDetect=off"
    echo "NodeName=lnode[1-$NODES] Name=gpu File=$DIR/dev/nvidia[0-$last]"
  } >"$DIR/gres.conf.new"
  CONF_CHANGED=0
  if install_file "$DIR/slurm.conf.new" "$CONF"; then CONF_CHANGED=1; fi
  if install_file "$DIR/gres.conf.new" "$GRES_CONF"; then CONF_CHANGED=1; fi
  write_oci_conf
}

install_sacct_shim() {  # sacct without slurmdbd fails; the shim answers from jobcomp + squeue
  install -D -m 755 "$HERE/sacct-shim.sh" "$DIR/bin/sacct"
  if [ ! -e "$SACCT_LINK" ] && [ ! -L "$SACCT_LINK" ] || [ "$(readlink "$SACCT_LINK")" = "$DIR/bin/sacct" ]; then
    ln -sfn "$DIR/bin/sacct" "$SACCT_LINK"
  else
    log "warning: $SACCT_LINK exists and is not ours; the sacct shim is only at $DIR/bin/sacct"
  fi
}

ctld_up() { [[ $(scontrol ping 2>/dev/null) == *"is UP"* ]]; }

start_slurmctld() {
  if pid_of slurmctld slurmctld >/dev/null; then
    if [ "$CONF_CHANGED" = 1 ]; then log "config changed: scontrol reconfigure"; scontrol reconfigure || true; fi
  else
    if ss -Hltn 'sport = :6817' | grep -q .; then
      die "port 6817 is taken by another slurmctld (e.g. cluster-recipes/slurm-up.sh); stop that cluster first"
    fi
    log "starting slurmctld as $CTL_HOST ($CTL_ADDR)"
    # own UTS namespace, so that SlurmctldHost=lsimctl matches whatever this machine is called
    start_daemon slurmctld unshare --uts sh -c "hostname $CTL_HOST && exec slurmctld -D"
  fi
  for _ in $(seq 100); do ctld_up && return 0; sleep 0.1; done
  tail -5 "$DIR/log/slurmctld.log" "$DIR/log/slurmctld.stdio" >&2 2>/dev/null || true
  die "slurmctld does not answer; see $DIR/log/slurmctld.log"
}

start_slurmds() {
  local k n
  for k in $(seq "$NODES"); do
    n=$(node "$k")
    pid_of "slurmd-$n" slurmd >/dev/null && continue
    mkdir -p "$DIR/spool/$n"
    log "starting slurmd $n in netns $n"
    # nsenter, not `ip netns exec`: that remounts /sys, and slurmd 22.05 then dies on a missing /sys/fs/cgroup
    start_daemon "slurmd-$n" nsenter --net="/run/netns/$n" unshare --uts sh -c "hostname $n && exec slurmd -D -N $n"
  done
}

wait_idle() {  # until every node is idle (or mix/alloc: jobs may run on a re-run); resume leftover DOWN nodes
  local deadline=$(($(date +%s) + WAIT_S)) states ready bad k
  log "waiting for $NODES idle nodes"
  while :; do
    for k in $(seq "$NODES"); do   # alive, not pid_of: right after the start, sh may not have exec'd slurmd yet
      alive "$(cat "$DIR/run/slurmd-$(node "$k").pid")" \
        || { tail -5 "$DIR/log/slurmd-$(node "$k").log" >&2 2>/dev/null; die "slurmd $(node "$k") exited; see $DIR/log/"; }
    done
    states=$(sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null | sort -u)
    ready=$(awk '$2 ~ /^(idle|mix|alloc|comp)$/' <<<"$states" | wc -l)
    [ "$ready" -ge "$NODES" ] && return 0
    bad=$(awk '$2 ~ /^(down|drain|drng|fail)$/ {print $1}' <<<"$states" | paste -sd, -)
    [ -z "$bad" ] || scontrol update NodeName="$bad" State=RESUME 2>/dev/null || true
    [ "$(date +%s)" -lt "$deadline" ] || { echo "$states" >&2; die "nodes not idle after ${WAIT_S}s; see $DIR/log/"; }
    sleep 0.1
  done
}

cmd_up() {
  [ "$(id -u)" = 0 ] || die "up must run as root"
  check_knobs
  mkdir -p "$DIR"/{state,run,log,spool,dev}
  echo "$MARK" >"$DIR/.owner"   # down deletes $DIR only when this file is there
  install_packages
  start_munge
  setup_network
  write_hosts
  write_configs
  install_sacct_shim
  start_slurmctld
  start_slurmds
  wait_idle
  sinfo
  log "cluster up: $NODES nodes, partition $PARTITION, gres gpu:$GPUS per node"
}

# ------------------------------------------------------------------------------------------ down
cmd_down() {
  [ "$(id -u)" = 0 ] || die "down must run as root"
  local f pid pids=() ns left v c
  shopt -s nullglob
  if pid_of slurmctld slurmctld >/dev/null && ctld_up; then   # cancel first: steps then end cleanly
    left=$(squeue -h -o %A 2>/dev/null | paste -sd' ' -)
    if [ -n "$left" ]; then
      log "cancelling jobs $left"
      # shellcheck disable=SC2086
      scancel $left 2>/dev/null || true
      for _ in $(seq 50); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  # all daemons at once; munged has a pid file only if we started it
  for f in "$DIR"/run/*.pid; do
    f=${f##*/}; f=${f%.pid}
    pid=$(pid_of "$f" "${f%%-*}") && pids+=("$pid")
  done
  stop_pids "daemons" 10 ${pids[@]+"${pids[@]}"}
  # whatever is left in a node (job steps, tasks; slurmstepd ignores SIGTERM): listed by the kernel, ended by pid
  for _ in 1 2 3; do
    left=$(netns_pids)
    [ -n "$left" ] || break
    # shellcheck disable=SC2086
    stop_pids "leftover processes in the node namespaces" 2 $left
  done
  for ns in $(our_netns); do log "deleting netns $ns"; ip netns del "$ns" 2>/dev/null || rm -f "/run/netns/$ns"; done
  for v in $(ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -E '^lsimv[0-9]+$' || true); do
    ip link del "$v" 2>/dev/null || true   # veths normally vanish with their namespace
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then log "deleting bridge $BRIDGE"; ip link del "$BRIDGE"; fi
  if [ -d "$OCI_ROOT" ]; then   # their processes are gone with the nodes'; runc's state and cgroups are left
    for c in $("$(runc_bin)" --root "$OCI_ROOT" list -q 2>/dev/null); do
      log "deleting container $c"; "$(runc_bin)" --root "$OCI_ROOT" delete --force "$c" 2>/dev/null || true
    done
    rm -rf "$OCI_ROOT"
  fi

  sed -i "/^# BEGIN $MARK\$/,/^# END $MARK\$/d" /etc/hosts
  for c in "$CONF" "$GRES_CONF" "$OCI_CONF"; do
    if [ -e "$c" ] && grep -q "$MARK" "$c"; then rm -f "$c"; fi
    if [ -e "$c.pre-$MARK" ]; then mv "$c.pre-$MARK" "$c"; fi
  done
  if [ -L "$SACCT_LINK" ] && [ "$(readlink "$SACCT_LINK")" = "$DIR/bin/sacct" ]; then rm -f "$SACCT_LINK"; fi
  if [ "${LSIM_KEEP:-0}" = 1 ]; then log "keeping $DIR (LSIM_KEEP=1)"
  elif [ "$(cat "$DIR/.owner" 2>/dev/null)" = "$MARK" ]; then rm -rf "$DIR"; fi
  log "cluster down"
}

# ------------------------------------------------------------------------------------------ status
cmd_status() {
  local k n pid ours=0 running=0 total=$((NODES + 1))
  echo "launchers dev Slurm cluster (state $DIR):"
  if pid=$(pid_of munged munged); then printf '  %-16s running, pid %s (started by up)\n' munged "$pid"; ours=1
  elif munge_ok; then printf '  %-16s answering (not started by up; left alone)\n' munged
  else printf '  %-16s not answering\n' munged; fi
  for n in slurmctld $(for k in $(seq "$NODES"); do node "$k"; done); do
    if [ "$n" = slurmctld ]; then pid=$(pid_of slurmctld slurmctld) || pid=""
    else pid=$(pid_of "slurmd-$n" slurmd) || pid=""; n="slurmd $n"; fi
    if [ -n "$pid" ]; then printf '  %-16s running, pid %s\n' "$n" "$pid"; running=$((running + 1))
    else printf '  %-16s not running\n' "$n"; fi
  done
  if ctld_up; then sinfo -N; squeue; fi
  if [ "$running" = "$total" ] && munge_ok; then echo "up"; return 0; fi
  if [ "$running" = 0 ] && [ "$ours" = 0 ] && [ -z "$(our_netns)" ] && ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    echo "down"; return 1
  fi
  echo "partly up ($running of $total slurm daemons): run up to complete it, or down to clean it"
  return 1
}

cmd_kill_node() {
  local k=${1:-} n pids
  [[ $k =~ ^[1-9][0-9]*$ ]] && [ "$k" -le "$NODES" ] || die "bad node '${k}': 1..$NODES is accepted"
  n=$(node "$k")
  pids=$(ip netns pids "$n" 2>/dev/null | paste -sd' ' -)
  [ -n "$pids" ] || die "node $n has no processes (not up?)"
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  log "node $n crashed: SIGKILL to $pids"
}

case "${1:-}" in
  kill-node) shift; cmd_kill_node "$@" ;;
  up|down)
    mkdir -p "$(dirname "$LOCK")"; exec 9>"$LOCK"; flock 9   # one up/down at a time
    "cmd_$1" ;;
  status) cmd_status ;;
  *) die "unknown command '${1:-}': up, down, status or kill-node K is accepted" ;;
esac
