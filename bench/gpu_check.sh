#!/usr/bin/env bash
# The GPU check of issue 24 (item 5): one run, under 10 minutes, on a machine with at least one NVIDIA GPU.
#
#   bash bench/gpu_check.sh            (from the repository root; PYTHON=... picks the interpreter with torch)
#   bash bench/gpu_check.sh --dry-run  (any machine: each launch local line of the steps checked by launch's own
#                                       --dry-run, nothing started; then the GPU verdict, exit 2 without one)
#
# Steps, each with its own time limit, each a PASS/FAIL/SKIP line and its figures; the exit code is 1 when a
# step failed, 2 when this machine has no GPU (nothing is run then):
#   0. launch local 1x1 --dist-backend auto (issue 33: decided on the node): workloads.convnet and the DDP
#      tutorial (examples/ddp_tutorial.py); from the run's own records: the node's decision
#      (status/backend-a0-node0.json: backend nccl, its GPUs and why), the run COMPLETED, and the rank's own line
#      in its log naming its device and backend (convnet's first line "... backend nccl device cuda:0 ...", the
#      tutorial's "DEVICE rank 0 device cuda:0 backend nccl"): the rank used GPU cuda:LOCAL_RANK with NCCL
#   1. launch local 1x1 --dist-backend nccl: workloads.convnet (NCCL_DEBUG=INFO), workloads.deepspeed_zero
#      --zero-stage 2, workloads.fsdp (FSDP2), a few steps each
#   2. launch doctor --local --gpu --json on the real GPU (its tools: nvidia-smi -q -x, topo -m, nvlink -s, ...)
#   3. the convnet rank's NCCL_DEBUG=INFO output through `launch nccl infolog`
#   4. hang detection (--hang-timeout, py-spy) on a CUDA rank stuck in a kernel that never ends
#   5. `launch nccl bench` all_reduce, and nccl-tests' all_reduce_perf on the same sizes read with
#      `launch nccl import`, when nccl-tests builds here: its source from NCCL_TESTS_SRC (a checkout or a
#      .tar.gz), else a `git clone` of github.com/NVIDIA/nccl-tests (needs the network); built under the
#      output folder at run time, never committed. No nvcc or no source: a SKIP line naming why.
# Everything lands in $OUT (default bench/out/gpu-check-<time>, ignored by git).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || command -v python3 )}
OUT=${OUT:-$ROOT/bench/out/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
LAUNCH=("$PY" -c 'import sys; from launchers.entry import main; sys.argv[0] = "launch"; main()')   # `launch`

DRY=0
case "${1:-}" in --dry-run) DRY=1 ;; "") ;; *) echo "gpu_check: $1 is not accepted; give nothing or --dry-run" >&2; exit 2 ;; esac
die() { echo "gpu_check: $*" >&2; exit 2; }

# The launch local lines of steps 0 and 1, written once here: NAME SECONDS BACKEND ARGS...
AUTO_RUNS=(
  "convnet-auto 120 auto -- -m workloads.convnet --dataset digits --max-steps 20"
  "ddp-auto 90 auto -- $ROOT/examples/ddp_tutorial.py --steps 10 --cleanup-seconds 0"
)
NCCL_RUNS=(
  "convnet 150 nccl --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=INIT,ENV,NET,GRAPH,TUNING -- -m workloads.convnet --dataset digits --max-steps 40"
  "zero2 200 nccl -- -m workloads.deepspeed_zero --zero-stage 2 --dataset digits --max-steps 40"
  "fsdp2 150 nccl -- -m workloads.fsdp --dataset digits --max-steps 40"
)
local_argv() {  # local_argv BACKEND RUN_DIR ARGS...: a step's launch local 1x1 line, into the array CMD
  local backend=$1 dir=$2; shift 2
  CMD=("${LAUNCH[@]}" local --nodes 1 --gpus-per-node 1 --dist-backend "$backend" --run-dir "$dir"
       ${DRY_FLAG:+"$DRY_FLAG"} "$@")
}
if [ $DRY = 1 ]; then     # no GPU needed: launch accepts every line, and says auto is decided on the node
  DRYDIR=$(mktemp -d) && cd "$DRYDIR" || die "cannot make a scratch dir"
  bad=0
  for line in "${AUTO_RUNS[@]}" "${NCCL_RUNS[@]}"; do
    set -- $line; name=$1 backend=$3; shift 3
    DRY_FLAG=--dry-run local_argv "$backend" "runs/$name" "$@"
    out=$("${CMD[@]}" 2>&1); rc=$?
    if [ $rc -ne 0 ]; then echo "gpu_check: DRY $name: refused (exit $rc): $(echo "$out" | tail -1)"; bad=1
    elif [ "$backend" = auto ] && ! grep -q "auto: decided on each node" <<<"$out"; then
      echo "gpu_check: DRY $name: the dry-run does not say auto is decided on the node"; bad=1
    else echo "gpu_check: DRY $name: accepted ($(grep -m1 -o 'world: .*' <<<"$out"))"; fi
  done
  cd "$ROOT" && rm -rf "$DRYDIR"
  [ $bad = 0 ] || { echo "gpu_check: dry run: a launch line was refused" >&2; exit 1; }
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' &&
    { echo "gpu_check: dry run: every launch line accepted; a GPU is here: run without --dry-run"; exit 0; }
fi
command -v nvidia-smi >/dev/null || die "no GPU here: nvidia-smi is not on PATH (this script needs an NVIDIA GPU machine)"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || true
[ "${GPUS:-0}" -ge 1 ] || die "no GPU here: nvidia-smi -L lists none ($(nvidia-smi -L 2>&1 | head -1))"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  die "no GPU here for torch: $PY cannot import torch or torch.cuda.is_available() is False (set PYTHON=...)"
mkdir -p "$OUT" || die "cannot create $OUT"
cd "$OUT" || exit 2
echo "gpu_check: $GPUS GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1);" \
     "torch $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'); out $OUT"

FAILED=0
T0=$(date +%s)
result() {  # result STEP STATUS DETAIL
  echo "gpu_check: $2 $1 ($(( $(date +%s) - T0 )) s so far): $3"
  [ "$2" = FAIL ] && FAILED=1
  return 0
}
state_of() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1] + "/status.json"))["state"])' "$1" 2>/dev/null || echo "?"; }

# ---------------------------------------------------------------- 0. --dist-backend auto, decided on the node
check_auto() {  # check_auto RUN_DIR: from the run's own records, the node decided nccl and the rank used cuda:0
  "$PY" - "$1" <<'EOF'
import json, re, sys
run = sys.argv[1]
try:
    rec = json.load(open(f"{run}/status/backend-a0-node0.json"))
except (OSError, ValueError) as e:
    print(f"no decision recorded by node 0 (status/backend-a0-node0.json: {e})"); sys.exit(1)
said = f"node 0 on {rec.get('host')}: {rec.get('backend')} ({rec.get('gpus')} GPU(s): {rec.get('why')})"
try:
    log = open(f"{run}/logs/node0/rank0.log", errors="replace").read()
except OSError as e:
    print(f"{said}; no rank 0 log: {e}"); sys.exit(1)
line = next((ln for ln in log.splitlines() if re.search(r"\bdevice \S+", ln) and re.search(r"\bbackend \S+", ln)), "")
device = (re.search(r"\bdevice (\S+)", line) or [None, None])[1]
backend = (re.search(r"\bbackend (\S+)", line) or [None, None])[1]
print(f"{said}; rank 0 (LOCAL_RANK 0) used device {device}, backend {backend}")
sys.exit(0 if (rec.get("backend"), device, backend) == ("nccl", "cuda:0", "nccl") and rec.get("gpus", 0) >= 1 else 1)
EOF
}
for line in "${AUTO_RUNS[@]}"; do
  set -- $line; name=$1 limit=$2 backend=$3; shift 3
  t=$(date +%s)
  local_argv "$backend" "runs/$name" "$@"
  timeout "$limit" "${CMD[@]}" >"$name.out" 2>&1
  rc=$?
  st=$(state_of "runs/$name")
  seen=$(check_auto "runs/$name"); ok=$?
  if [ $rc -eq 0 ] && [ "$st" = COMPLETED ] && [ $ok = 0 ]; then
    result "$name" PASS "$(( $(date +%s) - t )) s; $seen"
  else
    result "$name" FAIL "exit $rc, state $st; $seen; last lines: $(tail -3 "$name.out" | tr '\n' ' ')"
  fi
done

# ---------------------------------------------------------------- 1. three workloads, 1x1, nccl
run_workload() {  # run_workload NAME SECONDS BACKEND ARGS...
  local name=$1 limit=$2 backend=$3; shift 3
  local t=$(date +%s)
  local_argv "$backend" "runs/$name" "$@"
  timeout "$limit" "${CMD[@]}" >"$name.out" 2>&1
  local rc=$? st
  st=$(state_of "runs/$name")
  if [ $rc -eq 0 ] && [ "$st" = COMPLETED ]; then
    result "$name" PASS "$(( $(date +%s) - t )) s, $(grep -h -o 'loss[ =:][^ ,]*' runs/$name/logs/node0/rank0.log | tail -1)"
  else
    result "$name" FAIL "exit $rc, state $st, last lines: $(tail -3 "$name.out" | tr '\n' ' ')"
  fi
}
for line in "${NCCL_RUNS[@]}"; do
  run_workload $line
done

# ---------------------------------------------------------------- 2. doctor --gpu on the real GPU
timeout 120 "${LAUNCH[@]}" \
  doctor --local --gpu --json --run-root "$OUT/runs" >doctor.json 2>doctor.err
rc=$?
if [ $rc -le 1 ] && "$PY" - doctor.json <<'EOF'
import json, sys
rep = json.load(open(sys.argv[1]))
(node,) = rep["nodes"]
print("gpu_check: doctor --gpu:", node["checks"]["gpu_health"], "findings:", len(node["findings"]))
for f in node["findings"]:
    print(f"  {f['level']:5} {f['device']}: {f['fact']}")
sys.exit(0 if node["checks"]["gpu_health"]["value"] != "no nvidia-smi" else 1)
EOF
then result doctor-gpu PASS "exit $rc (1: the node has a fault; its lines above)"
else result doctor-gpu FAIL "exit $rc: $(tail -2 doctor.err | tr '\n' ' ')"; fi

# ---------------------------------------------------------------- 3. NCCL_DEBUG=INFO through infolog
if [ -f runs/convnet/logs/node0/rank0.log ] &&
   timeout 60 "${LAUNCH[@]}" \
     nccl infolog runs/convnet/logs/node0/rank0.log >infolog.txt 2>&1; then
  cat infolog.txt
  if grep -qi "version" infolog.txt; then result infolog PASS "$(wc -l <infolog.txt) lines"
  else result infolog FAIL "no NCCL version read from the INFO log"; fi
else
  result infolog FAIL "$(tail -2 infolog.txt 2>/dev/null | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- 4. hang detection on a CUDA rank
cat >hang_cuda.py <<'EOF'
import os, time
import torch, torch.distributed as dist
from launchers import heartbeat
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
t = torch.ones(1 << 20, device="cuda")
for step in range(10**6):
    if step == 5:
        print(f"HANGING rank {dist.get_rank()} step {step} at {time.time():.3f}", flush=True)
        torch.cuda._sleep(1 << 62)          # a kernel that does not end: the rank waits in synchronize
        torch.cuda.synchronize()
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"STEP {step}", flush=True)
    heartbeat.step(step)
    time.sleep(0.2)
EOF
t=$(date +%s)
timeout 180 "${LAUNCH[@]}" \
  local --nodes 1 --gpus-per-node 1 --dist-backend nccl --hang-timeout 20 --stop-grace 5 --run-dir runs/hang \
  -- hang_cuda.py >hang.out 2>&1
rc=$?
st=$(state_of runs/hang)
stack=$(ls runs/hang/hang/attempt0/rank0.txt 2>/dev/null)
if [ "$st" = FAILED ] && [ -n "$stack" ] && grep -q "synchronize\|hang_cuda" "$stack"; then
  result hang PASS "FAILED after $(( $(date +%s) - t )) s (exit $rc); rank 0's py-spy stack: $(grep -m2 -o 'synchronize.*\|hang_cuda.py:[0-9]*' "$stack" | tr '\n' ' ')"
  "${LAUNCH[@]}" status runs/hang | head -8
else
  result hang FAIL "exit $rc, state $st, stack file ${stack:-none}: $(tail -3 hang.out | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- 5. nccl bench vs nccl-tests all_reduce_perf
timeout 180 "${LAUNCH[@]}" \
  nccl bench --nodes 1 --gpus-per-node 1 --ops all_reduce --min-bytes 1K --max-bytes 64M --out bench \
  --run-dir runs/bench >bench.out 2>&1
rc=$?
if [ $rc -eq 0 ] && [ -f bench/results.csv ]; then result nccl-bench PASS "$(( $(wc -l <bench/results.csv) - 1 )) rows"; cat bench/results.csv
else result nccl-bench FAIL "exit $rc: $(tail -3 bench.out | tr '\n' ' ')"; fi

nccl_tests() {  # fetch (or take) nccl-tests and build all_reduce_perf against torch's NCCL; echo the binary
  local src=nccl-tests nvcc nccl
  if [ -n "${NCCL_TESTS_SRC:-}" ] && [ -d "$NCCL_TESTS_SRC" ]; then cp -r "$NCCL_TESTS_SRC" "$src"
  elif [ -n "${NCCL_TESTS_SRC:-}" ]; then mkdir -p "$src" && tar -xzf "$NCCL_TESTS_SRC" -C "$src" --strip-components=1
  else timeout 60 git clone -q --depth 1 https://github.com/NVIDIA/nccl-tests "$src" 2>/dev/null ||
    { echo "SKIP no source: git clone of github.com/NVIDIA/nccl-tests failed (set NCCL_TESTS_SRC)"; return; }
  fi
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
  [ -n "$nvcc" ] || { echo "SKIP no nvcc here (CUDA toolkit not installed)"; return; }
  nccl=$("$PY" - <<'EOF'
import glob, os
try:
    import nvidia.nccl as n
    base = os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0]
except ImportError:
    base = ""
print(base if glob.glob(os.path.join(base, "include", "nccl.h")) else "")
EOF
)
  local home=$PWD/nccl-home
  mkdir -p "$home/lib"
  if [ -n "$nccl" ]; then         # torch's wheel: nccl.h and libnccl.so.2 (no unversioned name for -lnccl)
    ln -sfn "$nccl/include" "$home/include"
    for f in "$nccl"/lib/libnccl.so*; do ln -sf "$f" "$home/lib/"; done
    ln -sf "$nccl/lib/libnccl.so.2" "$home/lib/libnccl.so"
  else home=${NCCL_HOME:-/usr}; fi
  if ! timeout 300 make -C "$src" -j"$(nproc)" MPI=0 CUDA_HOME="$(dirname "$(dirname "$nvcc")")" NCCL_HOME="$home" \
       src.build >nccl-tests-build.log 2>&1; then
    echo "SKIP nccl-tests did not build here: $(grep -m1 -i error nccl-tests-build.log || tail -1 nccl-tests-build.log)"
    return
  fi
  echo "BIN $PWD/$src/build/all_reduce_perf $home/lib"
}
nt=$(nccl_tests)
case "$nt" in
  BIN*)
    set -- $nt
    if LD_LIBRARY_PATH="$3${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 120 "$2" -b 1K -e 64M -f 2 -g 1 \
         >all_reduce_perf.txt 2>&1 &&
       "${LAUNCH[@]}" \
         nccl import all_reduce_perf.txt --out nccl-tests >import.txt 2>&1; then
      cat all_reduce_perf.txt import.txt
      result nccl-tests PASS "all_reduce_perf read by launch nccl import: nccl-tests/results.csv beside bench/results.csv"
    else
      result nccl-tests FAIL "all_reduce_perf or its import failed: $(tail -3 all_reduce_perf.txt import.txt 2>/dev/null | tr '\n' ' ')"
    fi ;;
  *) result nccl-tests SKIP "${nt#SKIP }" ;;
esac

echo "gpu_check: done in $(( $(date +%s) - T0 )) s; $( [ $FAILED = 0 ] && echo 'every step passed or was skipped' || echo 'a step FAILED' ); files in $OUT"
exit $FAILED
