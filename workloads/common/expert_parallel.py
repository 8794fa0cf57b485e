"""Expert parallelism: token dispatch/combine with all_to_all_single, timed around every collective;
its round-trip check (roundtrip_check) and the weights' hash with every expert gathered (full_hash).

Experts are numbered 0..E-1 globally; rank r owns experts [r*E/W, (r+1)*E/W). A token slot routed to
expert e goes to rank e // (E/W). Dispatch: exchange per-expert counts (all_to_all_single on an int
tensor), then the token vectors (variable split sizes); combine: the reverse all-to-all. Both go
through an autograd Function, so backward runs the mirror-image all-to-all and each expert receives
the gradient from every source rank's loss (= world size x the gradient of the global mean loss).
"""

from __future__ import annotations

import hashlib
import time

import torch
import torch.distributed as dist


class A2ATimer:
    """Seconds spent inside all-to-all calls (forward and backward) on this rank."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def run(self, out, inp, out_splits, in_splits, group=None):
        cuda = inp.is_cuda
        if cuda:
            torch.cuda.synchronize(inp.device)
        t0 = time.perf_counter()
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)
        if cuda:
            torch.cuda.synchronize(inp.device)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, timer, group):
        ctx.args = (out_splits, in_splits, timer, group)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        return timer.run(out, x.contiguous(), out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits, timer, group = ctx.args
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        return (
            timer.run(back, grad.contiguous(), in_splits, out_splits, group),
            None,
            None,
            None,
            None,
        )


def all_to_all(x, out_splits: list[int], in_splits: list[int], timer: A2ATimer, group=None):
    return _AllToAll.apply(x, out_splits, in_splits, timer, group)


class Dispatcher:
    """Route (token, slot) rows to the ranks owning their experts and bring the results back."""

    def __init__(self, num_experts: int, world_size: int, timer: A2ATimer, group=None) -> None:
        if num_experts % world_size:
            raise ValueError(
                f"{num_experts} experts cannot be split evenly over {world_size} ranks"
            )
        self.E, self.W, self.El = num_experts, world_size, num_experts // world_size
        self.timer, self.group = timer, group

    def dispatch(self, rows, expert_of_row):
        """rows [M, d], expert_of_row [M] (global ids). Returns (received [R, d], local expert id
        per received row [R], state for combine)."""
        order = torch.argsort(expert_of_row, stable=True)
        counts = torch.bincount(expert_of_row, minlength=self.E)  # [E]
        recv_counts = torch.empty_like(counts)
        self.timer.run(recv_counts, counts, [self.El] * self.W, [self.El] * self.W, self.group)
        send_splits = counts.view(self.W, self.El).sum(1).tolist()
        recv_splits = recv_counts.view(self.W, self.El).sum(1).tolist()
        received = all_to_all(rows[order], recv_splits, send_splits, self.timer, self.group)
        local_ids = torch.arange(self.El, device=rows.device).repeat(self.W)
        local_expert = torch.repeat_interleave(local_ids, recv_counts.to(rows.device))
        return received, local_expert, (order, send_splits, recv_splits)

    def combine(self, processed, state):
        """processed [R, d] in received order -> [M, d] in the caller's original row order."""
        order, send_splits, recv_splits = state
        back = all_to_all(processed, send_splits, recv_splits, self.timer, self.group)
        out = torch.empty_like(back)
        return out.index_copy(0, order, back)


def run_experts(experts, received, local_expert, first_global: int):
    """Apply local expert j to the rows with local_expert == j (experts: ModuleDict keyed by global
    id)."""
    out = received.new_zeros(received.shape[:1] + (experts[str(first_global)].out_features,))
    for j in range(len(experts)):
        idx = torch.nonzero(local_expert == j, as_tuple=True)[0]
        if idx.numel():
            out = out.index_copy(0, idx, experts[str(first_global + j)](received[idx]))
    return out


def roundtrip_check(model, env, device, d: int, log) -> dict:
    """Dispatch random rows to their experts' ranks and straight back: every row must come back
    bit-identical, and the tokens received over all ranks must equal those sent."""
    g = torch.Generator().manual_seed(99 + env.rank)
    n = 64 + 7 * env.rank
    rows = torch.randn(n, d, generator=g).to(device)
    experts = torch.randint(0, model.dispatcher.E, (n,), generator=g).to(device)
    received, local_e, state = model.dispatcher.dispatch(rows, experts)
    ok_owner = bool((local_e < model.dispatcher.El).all())
    back = model.dispatcher.combine(received, state)
    same = bool(torch.equal(back, rows)) and ok_owner
    t = torch.tensor([n, received.shape[0], int(not same)], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    res = {
        "sent": int(t[0]),
        "received": int(t[1]),
        "ok": int(t[2]) == 0 and int(t[0]) == int(t[1]),
    }
    print(
        f"moe-rank {env.rank}: a2a round trip sent {n} received {received.shape[0]} identical "
        f"{same}",
        flush=True,
    )
    log(f"moe: a2a round trip over all ranks: {res}")
    if not res["ok"]:
        raise RuntimeError(f"all-to-all round trip lost or changed tokens: {res}")
    return res


def full_hash(m, world_size: int) -> str:
    """sha256 over dense params (replicated) then every expert in global id order (gathered)."""
    mine = {
        n: p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        for n, p in m.named_parameters()
        if n.startswith("experts.")
    }
    parts: list = [None] * world_size
    dist.all_gather_object(parts, mine)
    experts = {k: v for part in parts for k, v in part.items()}
    h = hashlib.sha256()
    for n, p in m.named_parameters():
        if not n.startswith("experts."):
            h.update(n.encode())
            h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    for n in sorted(experts, key=lambda k: (int(k.split(".")[1]), k)):
        h.update(n.encode())
        h.update(experts[n])
    return h.hexdigest()
