#!/usr/bin/env bash
# ssh-hosts.sh - real sshd test hosts for `launch ssh`, simulated on this one Linux machine.
#
#   clusters/ssh-hosts.sh up            start N hosts (default 4), print the launch options last
#   clusters/ssh-hosts.sh down          stop everything `up` started; leaves nothing behind
#   clusters/ssh-hosts.sh status        one line per host; exit 0 only if every host answers ssh
#   clusters/ssh-hosts.sh options       print the `launch ssh` options line again
#   clusters/ssh-hosts.sh kill-host K   crash host K: SIGKILL its sshd and every process in it
#   clusters/ssh-hosts.sh cut-host K    partition host K: its eth0 goes down, processes keep running
#   clusters/ssh-hosts.sh revive-host K bring host K back (link up, sshd restarted, same host key)
#
# Host k is network namespace lssh<k> with IP 10.216.0.(10+k) on bridge lsshbr0 (10.216.0.1 in the
# root namespace, where the launcher runs). Its sshd runs in its own UTS (hostname sshhost<k>),
# PID (/proc shows only that host's processes; sshd is its PID 1), IPC (own /dev/shm) and mount
# namespace, inherited by every ssh session and everything started from it:
#   /var/tmp/launch-node-local  this host's private directory (other hosts and the root ns see
#                               their own / an empty one) -> exercises --no-shared-storage
#   /etc                        an overlay on the real /etc whose hosts file names every host
#                               (sshhost<k> -> its eth0 IP), so gloo and MASTER_ADDR=sshhost1 work
#                               without GLOO_SOCKET_IFNAME; an overlay, not a bind mount of the file,
#                               because a rename over the real /etc/hosts detaches such a mount
#   everything else             (/work/main, its .venv, /tmp, run dirs) is shared, like NFS.
# Hosts reach only 10.216.0.0/24 (no route out). Each host has its own ed25519 host key.
#
# State ($STATE, default /run/launch-ssh-hosts; not under /tmp or /var/tmp because sshd StrictModes
# refuses an authorized_keys below a world-writable directory): client_key, known_hosts, ssh_config,
# hostfile, etc_hosts, sshhost<k>/{sshd_config,ssh_host_ed25519_key*,sshd.pid (root-ns pid),sshd.log,
# etc/upper/hosts}, local/sshhost<k> (backing of that host's node-local dir).
# Knobs: LAUNCH_SSH_HOSTS_N=4 (1..64), LAUNCH_SSH_HOSTS_SLOTS=2, LAUNCH_SSH_HOSTS_STATE.
# Never touches /etc/ssh, the real /etc/hosts, or anything it did not create (other helpers'
# lnode*/lsimbr0/10.215.0.0/24 included). Never kills by name: by pid file or `ip netns pids`.
set -euo pipefail

STATE=${LAUNCH_SSH_HOSTS_STATE:-/run/launch-ssh-hosts}
N=${LAUNCH_SSH_HOSTS_N:-4}
SLOTS=${LAUNCH_SSH_HOSTS_SLOTS:-2}
NET=10.216.0
BR=lsshbr0
NODE_LOCAL=/var/tmp/launch-node-local
SSHD=/usr/sbin/sshd
LOCK=/run/lock/launch-ssh-hosts.lock

log() { printf '[ssh-hosts] %s\n' "$*" >&2; }
die() { printf 'ssh-hosts: error: %s\n' "$*" >&2; exit 2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }

case $STATE in /*) ;; *) die "LAUNCH_SSH_HOSTS_STATE='$STATE' must be an absolute path";; esac
case ${STATE%/} in ""|/run|/tmp|/var|/var/tmp|/etc|/root|/home) die "LAUNCH_SSH_HOSTS_STATE='$STATE' is a system directory; use a dedicated one";; esac
[[ $N =~ ^[0-9]+$ ]] && (( N >= 1 && N <= 64 )) || die "LAUNCH_SSH_HOSTS_N='$N' is not a host count; accepted: 1..64"
[[ $SLOTS =~ ^[0-9]+$ ]] && (( SLOTS >= 1 )) || die "LAUNCH_SSH_HOSTS_SLOTS='$SLOTS' is not a slot count; accepted: an integer >= 1"

name_of() { echo "sshhost$1"; }
ns_of() { echo "lssh$1"; }
ip_of() { echo "$NET.$((10 + $1))"; }
mac_of() { printf '02:6c:73:00:%02x:%02x\n' $(($1 / 256)) $(($1 % 256)); }   # k=0: the bridge (root ns)

options_line() {
  echo "--hostfile $STATE/hostfile --ssh-config $STATE/ssh_config --known-hosts $STATE/known_hosts"
}

alive() {  # pid exists and is not a zombie
  local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ -n $st && $st != Z ]]
}

is_our_sshd() {  # is_our_sshd k pid: pid is host k's listening sshd (our config, our netns)
  local d=$STATE/$(name_of "$1") pid=$2
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  # sshd retitles itself ("sshd: /usr/sbin/sshd -D -f ... [listener] ..."); sessions do not carry -f
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$SSHD -D -f $d/sshd_config " || return 1
  [[ $(ip netns identify "$pid" 2>/dev/null) == "$(ns_of "$1")" ]]
}

our_sshd_pid() {  # print host k's sshd pid (root-namespace pid, from our pid file) if it is running
  local d=$STATE/$(name_of "$1") pid
  [[ -s $d/sshd.pid ]] || return 1
  pid=$(cat "$d/sshd.pid")
  is_our_sshd "$1" "$pid" && echo "$pid"
}

kill_pids() {  # kill_pids <label> <signal-first> <pid>...: signal, wait <= 3 s, then SIGKILL
  local label=$1 sig=$2; shift 2
  (( $# )) || return 0
  log "$label: SIG$sig $*"
  kill "-$sig" "$@" 2>/dev/null || true
  local left=("$@") p
  for _ in $(seq 1 30); do
    local still=(); for p in "${left[@]}"; do alive "$p" && still+=("$p"); done
    left=("${still[@]+"${still[@]}"}")
    (( ${#left[@]} )) || return 0
    sleep 0.1
  done
  log "$label: SIGKILL ${left[*]}"
  kill -KILL "${left[@]}" 2>/dev/null || true
}

ns_pids() { ip netns pids "$1" 2>/dev/null || true; }

ssh_check() {  # ssh_check k [timeout]: verified host key, right hostname, private node-local mount, names resolve
  local k=$1 t=${2:-5}
  ssh -F "$STATE/ssh_config" -o ConnectTimeout="$t" "$(name_of "$k")" \
    "test \"\$(hostname)\" = $(name_of "$k") && mountpoint -q $NODE_LOCAL && getent hosts sshhost1 >/dev/null && echo ok" 2>/dev/null | grep -qx ok
}

write_shared_files() {  # hostfile, ssh_config, known_hosts, etc_hosts for hosts 1..N
  local k name ip hosts_tmp f
  { echo "# written by clusters/ssh-hosts.sh: $N test hosts (names resolve through $STATE/ssh_config)"
    for k in $(seq 1 "$N"); do echo "$(name_of "$k") slots=$SLOTS"; done; } > "$STATE/hostfile.new"
  { echo "# written by clusters/ssh-hosts.sh - ssh -F $STATE/ssh_config sshhost1"
    for k in $(seq 1 "$N"); do printf 'Host %s\n  HostName %s\n' "$(name_of "$k")" "$(ip_of "$k")"; done
    cat <<EOF
Host sshhost*
  User root
  Port 22
  IdentityFile $STATE/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $STATE/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
EOF
  } > "$STATE/ssh_config.new"
  for k in $(seq 1 "$N"); do  # both names: OpenSSH/paramiko look up the HostName (IP), users may use the alias
    name=$(name_of "$k"); ip=$(ip_of "$k")
    echo "$name,$ip $(cut -d' ' -f1,2 "$STATE/$name/ssh_host_ed25519_key.pub")"
  done > "$STATE/known_hosts.new"
  for f in hostfile ssh_config known_hosts; do chmod 0644 "$STATE/$f.new"; mv -f "$STATE/$f.new" "$STATE/$f"; done
  # each host's /etc overlay has its own upper hosts file: rewrite those in place (keep the inode)
  hosts_tmp=$(printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
              for k in $(seq 1 "$N"); do printf '%s\t%s\n' "$(ip_of "$k")" "$(name_of "$k")"; done)
  printf '%s\n' "$hosts_tmp" > "$STATE/etc_hosts"
  for k in $(seq 1 "$N"); do
    f=$STATE/$(name_of "$k")/etc/upper/hosts
    install -d -m 0755 "${f%/hosts}" "${f%/upper/hosts}/work"
    cmp -s "$STATE/etc_hosts" "$f" 2>/dev/null || { [[ -f $f ]] || install -m 0644 /dev/null "$f"; cat "$STATE/etc_hosts" > "$f"; }
  done
}

host_net_up() {  # namespace + veth + address for host k
  local k=$1 ns vh vp ip
  ns=$(ns_of "$k"); vh=v$ns; vp=v${ns}p; ip=$(ip_of "$k")
  [[ -e /run/netns/$ns ]] || { ip netns add "$ns"; log "created netns $ns"; }
  if ! ip link show "$vh" >/dev/null 2>&1; then
    ip netns exec "$ns" ip link del eth0 2>/dev/null || true   # stale half of an old pair
    ip link add "$vh" type veth peer name "$vp"
    ip link set "$vp" netns "$ns"
    ip netns exec "$ns" ip link set "$vp" name eth0
  fi
  ip link set "$vh" master "$BR"
  ip link set "$vh" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip link set eth0 address "$(mac_of "$k")"
  ip netns exec "$ns" ip addr replace "$ip/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
}

neighbors_up() {  # neighbors_up k...: permanent neighbor entries for every host and the bridge, in host k's
  # namespace (k=0: the root namespace, on the bridge). Fixed MACs (mac_of), so a revived host's entries stay
  # right. Without them, 64 hosts' gloo full mesh on a loaded 2-core machine saw connect() fail with "No route to
  # host" (an ARP request not answered in time); a test host's network is not what is under test.
  local k j dev batch all
  all=$(known_host_ks)
  for k in "$@"; do
    batch=""; dev=eth0; (( k == 0 )) && dev=$BR
    for j in 0 $all; do
      (( j == k )) && continue
      batch+="neigh replace $( (( j == 0 )) && echo "$NET.1" || ip_of "$j") lladdr $(mac_of "$j") dev $dev nud permanent"$'\n'
    done
    if (( k == 0 )); then printf '%s' "$batch" | sed '/lladdr '"$(mac_of 0)"'/d' | ip -batch - ;
    else printf '%s' "$batch" | ip -n "$(ns_of "$k")" -batch -; fi
  done
}

ensure_host_key() {  # one ed25519 host key per host, kept across revive and re-runs of up
  local d; d=$STATE/$(name_of "$1")
  install -d -m 0700 "$d"
  [[ -f $d/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N '' -C "$(name_of "$1")-hostkey" -f "$d/ssh_host_ed25519_key"
}

cgroup_mounts() {  # shell lines repeating this machine's cgroup mounts on a host: `ip netns exec` mounts a fresh
  # /sys, which hides them, and a container runtime there (podman's runc) finds no cgroup ("no cgroup mount found")
  awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break; t = $(i + 1); o = $(i + 3)
         if ($5 !~ "^/sys/fs/cgroup") next
         if ($5 == "/sys/fs/cgroup" && t == "tmpfs") print "mount -t tmpfs -o mode=755 lssh-cgroup /sys/fs/cgroup || :"
         else if (t == "cgroup" || t == "cgroup2") printf "mkdir -p %s && mount -t %s -o %s %s %s || :\n", $5, t, o, t, $5 }' \
    /proc/self/mountinfo
}

root_bashrc() { echo "$(getent passwd root | cut -d: -f6)/.bashrc"; }  # the hosts log in as root

host_bashrc() {  # host_bashrc DIR: the hosts' own ~/.bashrc, bind-mounted over this machine's on each host
  "$(dirname "${BASH_SOURCE[0]}")/host-bashrc.sh" "$1/bashrc"   # (why: clusters/host-bashrc.sh)
}

host_sshd_up() {  # config, host key and sshd for host k (kept if already running)
  local k=$1 name ns ip d pid p
  name=$(name_of "$k"); ns=$(ns_of "$k"); ip=$(ip_of "$k"); d=$STATE/$name
  ensure_host_key "$k"
  install -d -m 0755 "$STATE/local/$name"
  cat > "$d/sshd_config" <<EOF
ListenAddress $ip:22
HostKey $d/ssh_host_ed25519_key
PidFile none
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
MaxStartups 100:30:200
MaxSessions 64
ClientAliveInterval 5
ClientAliveCountMax 3
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
  "$SSHD" -t -f "$d/sshd_config" || die "sshd rejects $d/sshd_config"
  host_bashrc "$d"
  if pid=$(our_sshd_pid "$k"); then return 0; fi
  rm -f "$d/sshd.pid"
  # Own UTS, mount, IPC and PID namespaces, inherited by every session: hostname; a private
  # node-local dir (bind mount, then a tiny tmpfs over $STATE/local hides the other hosts' backing
  # dirs); an /etc overlay whose hosts file names all hosts; its own /proc (a host sees only its
  # own processes, as a real one does) and /dev/shm. sshd -D is PID 1 of the host: when it dies,
  # the kernel kills everything else on that host. setsid: Ctrl-C on `make` must not reach it.
  setsid ip netns exec "$ns" unshare --uts --mount --ipc --pid --fork --mount-proc --propagation private sh -ec "
    hostname '$name'
    mount --bind '$STATE/local/$name' '$NODE_LOCAL'
    mount -t tmpfs -o size=64k,mode=0755 lssh-hidden '$STATE/local'
    mount -t overlay lssh-etc -o 'lowerdir=/etc,upperdir=$d/etc/upper,workdir=$d/etc/work' /etc
    mount -t tmpfs -o mode=1777 lssh-shm /dev/shm
    if [ -f '$d/bashrc' ]; then mount --bind '$d/bashrc' '$(root_bashrc)'; fi
    $(cgroup_mounts)
    exec '$SSHD' -D -f '$d/sshd_config' -E '$d/sshd.log'" </dev/null >>"$d/sshd.log" 2>&1 9>&- &
  pid=
  for _ in $(seq 1 50); do
    for p in $(ns_pids "$ns"); do is_our_sshd "$k" "$p" && { pid=$p; break 2; }; done
    sleep 0.1
  done
  [[ -n $pid ]] || die "sshd for $name did not start (see $d/sshd.log)"
  echo "$pid" > "$d/sshd.pid"
  log "started sshd for $name on $ip:22 in netns $ns (pid $pid)"
}

wait_ssh() {  # wait_ssh k...: every host answers over ssh with a verified host key (parallel)
  local k pids=() bad=()
  for k in "$@"; do
    ( for _ in $(seq 1 50); do ssh_check "$k" 2 && exit 0; sleep 0.1; done; exit 1 ) & pids+=($!)
  done
  local i=0
  for k in "$@"; do wait "${pids[$i]}" || bad+=("$(name_of "$k")"); i=$((i + 1)); done
  (( ${#bad[@]} == 0 )) || die "not reachable over ssh: ${bad[*]} (see $STATE/<host>/sshd.log)"
}

host_down() {  # stop host k entirely: sshd by pid file, then every pid left in its netns, then netns
  local k=$1 ns name pid strays
  ns=$(ns_of "$k"); name=$(name_of "$k")
  if pid=$(our_sshd_pid "$k"); then kill_pids "$name sshd" TERM "$pid"; fi
  if [[ -e /run/netns/$ns ]]; then
    mapfile -t strays < <(ns_pids "$ns")
    if (( ${#strays[@]} )); then kill_pids "$name leftovers" TERM "${strays[@]}"; fi
    ip netns del "$ns" && log "deleted netns $ns"
  fi
  if ip link show "v$ns" >/dev/null 2>&1; then ip link del "v$ns" 2>/dev/null || true; fi
}

known_host_ks() {  # k of every host we may have created: state dirs, netns, veths (exact names)
  { ls -1 "$STATE" 2>/dev/null | sed -n 's/^sshhost\([0-9]\+\)$/\1/p'
    ls -1 /run/netns 2>/dev/null | sed -n 's/^lssh\([0-9]\+\)$/\1/p'
    ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed -n 's/^vlssh\([0-9]\+\)@.*/\1/p'
  } | sort -un
}

cmd_up() {
  local t0 k; t0=$(now)
  [[ $(id -u) -eq 0 ]] || die "must run as root"
  if ! command -v "$SSHD" >/dev/null || ! command -v ip >/dev/null; then
    log "installing openssh-server iproute2"
    flock /tmp/apt.lock apt-get install -y -q -o DPkg::Lock::Timeout=600 openssh-server iproute2 >&2 \
      || die "apt-get install openssh-server iproute2 failed"
  fi
  for b in ip "$SSHD" ssh ssh-keygen unshare mountpoint flock; do command -v "$b" >/dev/null || die "missing program $b"; done
  [[ -d /run/sshd ]] || install -d -m 0755 /run/sshd   # privsep dir; shared with any other sshd, never removed
  install -d -m 0755 "$STATE" "$STATE/local"
  if [[ ! -d $NODE_LOCAL ]]; then install -d -m 0755 "$NODE_LOCAL"; touch "$STATE/created-node-local-dir"; fi
  [[ -f $STATE/client_key ]] || ssh-keygen -q -t ed25519 -N '' -C launch-ssh-hosts-client -f "$STATE/client_key"
  install -m 0600 "$STATE/client_key.pub" "$STATE/authorized_keys"

  local other; other=$(ip -4 -o addr show to "$NET.0/24" | awk -v br="$BR" '$2 != br {print $2}' | sort -u | tr '\n' ' ')
  [[ -z $other ]] || die "subnet $NET.0/24 is already used by interface(s) $other; not touching it"
  ip link show "$BR" >/dev/null 2>&1 || { ip link add "$BR" type bridge; log "created bridge $BR"; }
  ip link set "$BR" address "$(mac_of 0)"
  ip addr replace "$NET.1/24" dev "$BR"
  ip link set "$BR" up

  for k in $(known_host_ks); do
    (( k > N )) || continue
    log "host $k is beyond LAUNCH_SSH_HOSTS_N=$N: removing it"
    host_down "$k"; rm -rf -- "${STATE:?}/$(name_of "$k")" "$STATE/local/$(name_of "$k")"
  done
  for k in $(seq 1 "$N"); do ensure_host_key "$k"; done
  write_shared_files
  for k in $(seq 1 "$N"); do host_net_up "$k"; host_sshd_up "$k"; done
  neighbors_up $(seq 0 "$N")
  wait_ssh $(seq 1 "$N")
  log "up: $N hosts sshhost1..sshhost$N ($NET.11..) in $(since "$t0") s; state in $STATE; try: ssh -F $STATE/ssh_config sshhost1 hostname"
  options_line
}

cmd_down() {
  local t0 k; t0=$(now)
  [[ $(id -u) -eq 0 ]] || die "must run as root"
  for k in $(known_host_ks); do host_down "$k"; done
  for _ in $(seq 1 50); do  # netns teardown is asynchronous: wait for our veths to vanish
    ip -o link show 2>/dev/null | grep -qE ': vlssh[0-9]+@' || break
    sleep 0.1
  done
  if ip link show "$BR" >/dev/null 2>&1; then ip link del "$BR" && log "deleted bridge $BR"; fi
  if [[ -f $STATE/created-node-local-dir ]]; then
    rmdir "$NODE_LOCAL" 2>/dev/null && log "removed $NODE_LOCAL" || log "left $NODE_LOCAL in place (not empty)"
  fi
  if [[ -d $STATE ]]; then rm -rf -- "$STATE" && log "removed $STATE"; fi
  log "down in $(since "$t0") s (/run/sshd left in place: shared with any other sshd)"
}

cmd_status() {
  local k ns name pid link ok=0 pids=() ks
  ks=$(known_host_ks)
  [[ -n $ks ]] || { echo "no test hosts (run: clusters/ssh-hosts.sh up)"; return 1; }
  for k in $ks; do ( ssh_check "$k" 2 ) & pids+=($!); done
  local i=0
  for k in $ks; do
    ns=$(ns_of "$k"); name=$(name_of "$k")
    pid=$(our_sshd_pid "$k" || echo -)
    link=$(ip netns exec "$ns" cat /sys/class/net/eth0/operstate 2>/dev/null || echo none)
    if wait "${pids[$i]}"; then s=ok; else s=DOWN; ok=1; fi
    printf '%-10s %-6s %-13s sshd=%-7s eth0=%-5s procs=%-3s ssh=%s\n' "$name" "$ns" "$(ip_of "$k")" \
      "$pid" "$link" "$(ns_pids "$ns" | wc -l)" "$s"
    i=$((i + 1))
  done
  return $ok
}

host_arg() {  # validate K for the fault commands
  local k=${1:-}
  [[ $k =~ ^[0-9]+$ && -d $STATE/$(name_of "${k:-0}") ]] \
    || die "host '$k' is not a test host; accepted: $(known_host_ks | tr '\n' ' ')(hosts must be up)"
  echo "$k"
}

cmd_kill_host() {  # crash: SIGKILL sshd and everything else in the namespace, by pid
  local k ns pids; k=$(host_arg "${1:-}"); ns=$(ns_of "$k")
  mapfile -t pids < <(ns_pids "$ns")
  if (( ${#pids[@]} )); then
    log "$(name_of "$k"): SIGKILL ${pids[*]}"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 1 30); do local a=0 p; for p in "${pids[@]}"; do alive "$p" && a=1; done; (( a )) || break; sleep 0.1; done
  fi
  rm -f "$STATE/$(name_of "$k")/sshd.pid"
  log "$(name_of "$k") killed (revive with: clusters/ssh-hosts.sh revive-host $k)"
}

cmd_cut_host() {  # partition: interface down, processes keep running, packets are dropped silently
  local k; k=$(host_arg "${1:-}")
  ip netns exec "$(ns_of "$k")" ip link set eth0 down
  log "$(name_of "$k") cut off (eth0 down; revive with: clusters/ssh-hosts.sh revive-host $k)"
}

cmd_revive_host() {
  local k; k=$(host_arg "${1:-}")
  host_net_up "$k"; neighbors_up "$k"; host_sshd_up "$k"; wait_ssh "$k"
  log "$(name_of "$k") is back"
}

usage() { echo "usage: clusters/ssh-hosts.sh up|down|status|options|kill-host K|cut-host K|revive-host K" >&2; exit 2; }

cmd=${1:-}; shift || true
exec 9>"$LOCK"
case $cmd in
  up) flock 9; cmd_up ;;
  down) flock 9; cmd_down ;;
  status) cmd_status ;;
  options) options_line ;;
  kill-host) flock 9; cmd_kill_host "$@" ;;
  cut-host) flock 9; cmd_cut_host "$@" ;;
  revive-host) flock 9; cmd_revive_host "$@" ;;
  *) [[ -z $cmd ]] && usage; die "unknown command '$cmd'; accepted: up, down, status, options, kill-host K, cut-host K, revive-host K" ;;
esac
