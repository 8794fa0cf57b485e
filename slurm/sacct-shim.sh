#!/usr/bin/env bash
# sacct-shim.sh - `sacct` for a Slurm cluster without slurmdbd (the launchers dev cluster).
#
# With AccountingStorageType=accounting_storage/none the real sacct says "Slurm accounting storage is
# disabled" and exits 1, so a poller (submitit runs `sacct -o JobID,State,NodeList --parsable2 -j ID`) never
# learns that a job ended and waits forever for a job killed without a result. This shim answers from
#   1. the real `sacct -c`: finished jobs, read from the jobcomp/filetxt log;
#   2. squeue: live jobs (PENDING, RUNNING, COMPLETING, ...), printed AFTER the jobcomp rows, so for a job
#      that was requeued the last row for its id is its live state.
# Live rows are added only to --parsable/--parsable2 output (what programs read). Fields squeue does not
# know print empty; ExitCode prints 0:0 for a live job. dev-cluster.sh up links it as /usr/local/bin/sacct.
REAL=${LSIM_REAL_SACCT:-/usr/bin/sacct}

fields="JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"   # sacct's default format
ids="" sep="" noheader=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]} next=${args[i + 1]:-}
  case "$a" in
    -o|--format) fields=$next ;;
    --format=*) fields=${a#--format=} ;;
    -j|--jobs) ids+=",$next" ;;
    --jobs=*) ids+=",${a#--jobs=}" ;;
    -P|--parsable2) sep=2 ;;
    -p|--parsable) sep=1 ;;
    -n|--noheader) noheader=1 ;;
    --*) ;;
    -o?*) fields=${a#-o} ;;
    -j?*) ids+=",${a#-j}" ;;
    -*) [[ $a == *P* ]] && sep=2; [[ $a == *p* ]] && sep=1; [[ $a == *n* ]] && noheader=1 ;;  # bundled: -XPn
  esac
done

out=$("$REAL" -c "$@" 2>/dev/null) || out=""
if [ -z "$out" ] && [ -n "$sep" ] && [ "$noheader" = 0 ]; then   # nothing finished yet: still print a header
  out=$(sed 's/%[0-9]*//g; s/,/|/g' <<<"$fields")$([ "$sep" = 1 ] && echo "|")
fi
[ -z "$out" ] || printf '%s\n' "$out"
[ -n "$sep" ] || exit 0

# sacct field -> squeue -o code
sq=""
IFS=',' read -r -a names <<<"$fields"
for f in "${names[@]}"; do
  f=${f%%%*}
  case "${f,,}" in
    jobid) c=%i ;; jobidraw) c=%A ;; jobname) c=%j ;; state) c=%T ;; nodelist) c=%N ;;
    partition) c=%P ;; account) c=%a ;; qos) c=%q ;; user) c=%u ;; uid) c=%U ;; group) c=%g ;; gid) c=%G ;;
    nnodes) c=%D ;; alloccpus|ncpus|reqcpus) c=%C ;; submit) c=%V ;; start) c=%S ;; end) c=%e ;;
    elapsed) c=%M ;; timelimit) c=%l ;; reason) c=%r ;; workdir) c=%Z ;; priority) c=%Q ;;
    exitcode|derivedexitcode) c=0:0 ;;
    *) c="" ;;
  esac
  sq+="${sq:+|}$c"
done
[ "$sep" = 1 ] && sq+="|"
# two hidden leading columns (array job id, job id) select the rows that -j asked for
squeue -h -o "%F|%A|$sq" 2>/dev/null | awk -F'|' -v ids="${ids#,}" '
  BEGIN { n = split(ids, want_list, ","); for (i = 1; i <= n; i++) want[want_list[i]] = 1 }
  n == 0 || ($1 in want) || ($2 in want) { sub(/^[^|]*\|[^|]*\|/, ""); print }'
exit 0
