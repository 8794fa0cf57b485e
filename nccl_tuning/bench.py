"""Collective benchmark, a worker program run under torchrun (one process per rank):

    torchrun --nproc-per-node 4 -m nccl_tuning.bench --ops all_reduce,all_to_all \
        --min-bytes 1K --max-bytes 1M --out results.csv

Sizes are powers of two from --min-bytes to --max-bytes, meaning what nccl-tests means: the
per-rank buffer (all_gather: the gathered output; reduce_scatter: the input). Each size runs
--warmup untimed and --iters timed iterations; time_us is the mean over the timed iterations of the
slowest rank. algbw = bytes / time; busbw = algbw x nccl-tests' factor (all_reduce 2(n-1)/n;
all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast 1). With --repeats R the timed block
runs R times; spread_pct = (slowest - fastest block) / mean block time x 100, a noise estimate the
sweep uses (0 with one block). Every result is checked exactly
(small integer-valued float32 data) in one untimed call before timing. Without --out, results go to
$LAUNCH_RUN_DIR/results.csv when run by `launch` (rank 0 writes it). Backend: nccl on CUDA, else
gloo (results are labelled with the backend). Only the module's main() imports torch.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import time

from .errors import NcclTuningError
from .results import COLUMNS

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
CSV_COLUMNS = COLUMNS
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '256M', '4096', '1GiB', '2KB' (binary units); anything else is an error."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        raise NcclTuningError(
            f"size {text!r} is not a size (accepted: a positive number of bytes "
            f"with an optional K, M, G or T suffix, e.g. 1K, 256M)"
        )
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    if min_bytes > max_bytes:
        raise NcclTuningError(f"--min-bytes {min_bytes} is larger than --max-bytes {max_bytes}")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= 2
    return out


def parse_ops(text: str) -> list[str]:
    ops = [o.strip() for o in text.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise NcclTuningError(
            f"--ops {text!r}: unknown op(s) {', '.join(bad) or '(none)'} "
            f"(accepted: {', '.join(OPS)})"
        )
    return ops


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def element_count(op: str, nbytes: int, n: int, elem: int = 4) -> int:
    """Elements of the per-rank buffer, rounded down so it splits evenly across ranks."""
    count = max(nbytes // elem, 1)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(count // n, 1) * n
    return count


def _cli(argv):
    ap = argparse.ArgumentParser(
        prog="python -m nccl_tuning.bench", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--min-bytes", default="1K")
    ap.add_argument("--max-bytes", default="1M")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument(
        "--repeats", type=int, default=1, help="timed blocks of --iters (noise estimate)"
    )
    ap.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    ap.add_argument(
        "--out",
        default=None,
        help="results.csv path, or a directory for results.csv (default: $LAUNCH_RUN_DIR when set)",
    )
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = os.environ.get("LAUNCH_RUN_DIR") or None
    try:
        args.ops = parse_ops(args.ops)
        args.sizes = sizes(parse_size(args.min_bytes), parse_size(args.max_bytes))
        if args.warmup < 0 or args.iters < 1 or args.repeats < 1:
            raise NcclTuningError(
                f"--warmup {args.warmup} / --iters {args.iters} / --repeats "
                f"{args.repeats}: accepted are warmup >= 0, iters >= 1, repeats >= 1"
            )
    except NcclTuningError as e:
        ap.exit(2, f"launch: error: {e}\n")
    return args


# ---- the torch part (only runs under torchrun) -------------------------------------------------


def _pattern(torch, rank, count, device, salt=0):
    """Small integers (exact in float32 even when summed over many ranks)."""
    i = torch.arange(count, device=device, dtype=torch.int64)
    return ((i * 7 + salt) % 13 + rank + 1).to(torch.float32)


class _Case:
    """Buffers, the collective call and the exact expected result for one op and size."""

    def __init__(self, torch, dist, op, count, rank, n, device):
        self.run = None
        c = count // n if op in ("all_gather", "reduce_scatter", "all_to_all") else count
        pat = lambda r, k, salt=0: _pattern(torch, r, k, device, salt)
        if op == "all_reduce":
            self.buf = pat(rank, count)
            self.expect = sum(pat(r, count) for r in range(n))
            self.run = lambda: dist.all_reduce(self.buf)
            self.result = lambda: self.buf
            self.reset = lambda: self.buf.copy_(pat(rank, count))
        elif op == "broadcast":
            self.buf = pat(0, count) if rank == 0 else torch.zeros(count, device=device)
            self.expect = pat(0, count)
            self.run = lambda: dist.broadcast(self.buf, src=0)
            self.result = lambda: self.buf
            self.reset = lambda: None
        elif op == "all_gather":
            self.inp, self.out = pat(rank, c), torch.zeros(c * n, device=device)
            self.expect = torch.cat([pat(r, c) for r in range(n)])
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            self.run = lambda: gather(self.out, self.inp)
            self.result = lambda: self.out
            self.reset = lambda: None
        elif op == "reduce_scatter":
            self.inp, self.out = pat(rank, c * n), torch.zeros(c, device=device)
            self.expect = sum(pat(r, c * n) for r in range(n))[rank * c : (rank + 1) * c]
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            self.run = lambda: scatter(self.out, self.inp)
            self.result = lambda: self.out
            self.reset = lambda: None
        elif op == "all_to_all":
            # chunk j of rank r's input is pattern(r, salt=j); rank k receives chunk k of every r
            self.inp = torch.cat([pat(rank, c, salt=j) for j in range(n)])
            self.out = torch.zeros(c * n, device=device)
            self.expect = torch.cat([pat(r, c, salt=rank) for r in range(n)])
            self.run = lambda: dist.all_to_all_single(self.out, self.inp)
            self.result = lambda: self.out
            self.reset = lambda: None


def _measure(torch, dist, case, warmup, iters, sync, repeats=1):
    """-> (mean seconds per call over all timed blocks, [per-block means], wrong elements)."""
    case.reset()
    case.run()
    sync()
    wrong = int((case.result() != case.expect).sum().item())
    for _ in range(warmup):
        case.run()
    sync()
    blocks = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            case.run()
        sync()
        blocks.append((time.perf_counter() - t0) / iters)
    return sum(blocks) / len(blocks), blocks, wrong


def main(argv=None) -> int:
    args = _cli(argv)
    import torch
    import torch.distributed as dist

    backend, device, sync = _device(torch, args.backend)
    dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    rows, unsupported = [], {}
    if rank == 0:
        print(
            f"# nccl_tuning.bench: backend {backend}, {n} ranks, float32, sum, "
            f"warmup {args.warmup}, iters {args.iters}, repeats {args.repeats}"
        )
        print(
            f"# {'op':>14} {'size':>12} {'count':>10} {'time(us)':>10} {'algbw':>8} "
            f"{'busbw':>8} {'#wrong':>7}"
        )
    for op in args.ops:
        for nbytes in args.sizes:
            count = element_count(op, nbytes, n)
            case = _Case(torch, dist, op, count, rank, n, device)
            try:
                timed = _measure(torch, dist, case, args.warmup, args.iters, sync, args.repeats)
            except (RuntimeError, NotImplementedError) as e:
                unsupported[op] = str(e).splitlines()[0][:160]
                break
            r = _row(torch, dist, op, count, n, timed, device, backend)
            rows.append(r)
            if rank == 0:
                print(
                    f"  {op:>14} {r['bytes']:>12} {count:>10} {r['time_us']:>10.1f} "
                    f"{r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f} {r['wrong']:>7}",
                    flush=True,
                )
    if rank == 0:
        _summary(rows, unsupported, backend, args.out)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if any(r["wrong"] for r in rows) else 0


def _device(torch, backend: str):
    """-> (backend, device, sync): --backend auto is $LAUNCH_DIST_BACKEND, else nccl with CUDA, else
    gloo."""
    if backend == "auto":
        backend = os.environ.get("LAUNCH_DIST_BACKEND") or (
            "nccl" if torch.cuda.is_available() else "gloo"
        )
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return backend, torch.device("cuda", local), torch.cuda.synchronize
    return backend, torch.device("cpu"), (lambda: None)


def _row(torch, dist, op: str, count: int, n: int, timed, device, backend: str) -> dict:
    """One size's result row from _measure's (seconds, blocks, wrong): the slowest rank's times,
    every rank's wrong elements."""
    elapsed, blocks, wrong = timed
    slowest = torch.tensor([elapsed, *blocks], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    wrong_all = torch.tensor([float(wrong)], dtype=torch.float64, device=device)
    dist.all_reduce(wrong_all)
    t_s, wrong_total = float(slowest[0].item()), int(wrong_all.item())
    per_block = [float(x) for x in slowest[1:].tolist()]
    spread = (max(per_block) - min(per_block)) / (sum(per_block) / len(per_block)) * 100
    real_bytes = count * 4
    algbw = real_bytes / t_s / 1e9
    busbw = algbw * bus_factor(op, n)
    return {
        "op": op,
        "bytes": real_bytes,
        "ranks": n,
        "time_us": t_s * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": busbw,
        "wrong": wrong_total,
        "backend": backend,
        "count": count,
        "dtype": "float32",
        "spread_pct": spread,
    }


def _summary(rows: list, unsupported: dict, backend: str, out) -> None:
    """Rank 0's end: the ops the backend lacks, results.csv (--out), the count of results and wrong
    elements."""
    for op, why in unsupported.items():
        print(f"# {op}: not supported by the {backend} backend here ({why})")
    if out:
        _write_csv(out, rows)
    bad = sum(r["wrong"] for r in rows)
    print(f"# {len(rows)} results, {bad} wrong element(s)")


def _write_csv(out: str, rows):
    path = out if out.endswith(".csv") else os.path.join(out, "results.csv")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})


if __name__ == "__main__":
    sys.exit(main())
