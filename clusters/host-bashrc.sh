#!/usr/bin/env bash
# host-bashrc.sh OUT - write OUT: root's ~/.bashrc with its `pyenv init` eval lines commented out (PATH kept),
# for a test host to bind-mount over the machine's (clusters/ssh-hosts.sh, clusters/slurm-login.sh). bash reads
# ~/.bashrc for every command sshd runs; this machine's runs `pyenv init`, which runs `pyenv rehash` under a lock
# file in the one ~/.pyenv every host shares: a host killed mid-rehash leaves the lock behind, and from then on
# every shell on every host waits 60 s for it (PYENV_REHASH_TIMEOUT). Exit 0 and no OUT when root has no ~/.bashrc.
set -euo pipefail
out=${1:?usage: host-bashrc.sh OUT}
rc="$(getent passwd root | cut -d: -f6)/.bashrc"
rm -f "$out"
[[ -f $rc ]] || exit 0
sed -E 's/^([[:space:]]*eval[[:space:]].*pyenv[[:space:]].*init.*)$/# (a test host does not run this: clusters\/host-bashrc.sh) \1/' \
  "$rc" > "$out"
