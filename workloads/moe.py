"""Mixture-of-experts transformer block, expert parallel: the job the `moe` NCCL preset is for.

    launch local --nodes 2 --gpus-per-node 2 --run-dir runs/moe -- -m workloads.moe --num-experts 8
    --max-steps 60

Model: token embedding + positions -> self-attention (dense) -> MoE feed-forward (top-k gate with a
Switch-style load-balancing loss, E experts sharded over the W ranks, E/W each) -> mean pool ->
head. Dense parameters are data-parallel (gradients all-reduced before every optimizer step); expert
parameters live on one rank only (tokens travel to them with all_to_all_single and back). Task
(synthetic, learnable): each of --classes topics owns a subset of the vocabulary; a sequence mixes
topic tokens with noise tokens and its label is the topic. Logged: `a2a_fraction` = share of wall
time inside all-to-all calls (forward + backward, averaged over ranks) per logged window and for the
whole run (final.json), experts and parameter counts per rank. Checkpoints: workloads.common (DCP);
expert parameters carry their global id in their name, so a checkpoint also loads on another world
size that divides the expert count.
"""

from __future__ import annotations

import sys
import time

from workloads.common import args as common_args
from workloads.common import dist as wdist


def build_parser():
    p = common_args.common_parser(
        "moe",
        "Expert-parallel MoE transformer block on a synthetic topic task (--dataset is ignored).",
        epochs=2,
        batch_size=16,
        lr=3e-3,
        checkpoint_every=20,
        log_every=5,
    )
    g = p.add_argument_group("model")
    g.add_argument(
        "--num-experts",
        type=common_args.positive_int,
        default=8,
        help="total, split evenly over ranks",
    )
    g.add_argument("--top-k", type=common_args.positive_int, default=2)
    g.add_argument("--d-model", type=common_args.positive_int, default=32)
    g.add_argument("--d-ff", type=common_args.positive_int, default=64)
    g.add_argument("--heads", type=common_args.positive_int, default=4)
    g.add_argument("--seq-len", type=common_args.positive_int, default=16)
    g.add_argument("--vocab", type=common_args.positive_int, default=64)
    g.add_argument("--classes", type=common_args.positive_int, default=8)
    g.add_argument(
        "--aux-coef", type=common_args.nonneg_float, default=0.01, help="load-balancing loss weight"
    )
    g.add_argument("--n-train", type=common_args.positive_int, default=2048)
    return p


def check(parser, args, world_size: int) -> None:
    """Model-shape checks before the process group exists (same argv on every rank: same
    verdict)."""
    if args.num_experts % world_size:
        parser.error(
            f"--num-experts {args.num_experts} is not divisible by the world size {world_size} "
            f"(accepted: a multiple of {world_size}; experts are split evenly over the ranks)"
        )
    if args.top_k > args.num_experts:
        parser.error(
            f"--top-k {args.top_k} is larger than --num-experts {args.num_experts} (accepted: "
            f"1..{args.num_experts})"
        )
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    if args.classes > args.vocab:
        parser.error(
            f"--classes {args.classes} exceeds --vocab {args.vocab} (each class needs its own "
            "tokens)"
        )


def make_data(args):
    import torch

    from workloads.common.data import ArrayDataset, Data

    g = torch.Generator().manual_seed(20240607)  # fixed data, independent of --seed
    n_test = 512
    n = args.n_train + n_test
    y = torch.randint(0, args.classes, (n,), generator=g)
    per_class = args.vocab // args.classes  # topic c owns tokens c, c+C, c+2C, ...
    topic = y[:, None] + args.classes * torch.randint(0, per_class, (n, args.seq_len), generator=g)
    noise = torch.randint(0, args.vocab, (n, args.seq_len), generator=g)
    x = torch.where(torch.rand(n, args.seq_len, generator=g) < 0.4, topic, noise)
    return Data(
        "moe-topics",
        ArrayDataset(x[: args.n_train], y[: args.n_train]),
        ArrayDataset(x[args.n_train :], y[args.n_train :]),
        (args.seq_len,),
        args.classes,
    )


def expert_class():
    """One expert: a 2-layer MLP (d -> d_ff -> d, GELU)."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Expert(nn.Module):
        def __init__(self, d, dff):
            super().__init__()
            self.w1, self.w2, self.out_features = nn.Linear(d, dff), nn.Linear(dff, d), d

        def forward(self, x):
            return self.w2(F.gelu(self.w1(x)))

    return Expert


def build_model(args, env, timer):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from workloads.common.expert_parallel import Dispatcher, run_experts

    Expert = expert_class()
    per_rank = args.num_experts // env.world_size
    first = env.rank * per_rank

    class MoEBlock(nn.Module):
        def __init__(self):
            super().__init__()
            d = args.d_model
            self.embed = nn.Embedding(args.vocab, d)
            self.pos = nn.Parameter(torch.randn(args.seq_len, d) * 0.02)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, args.heads, batch_first=True)
            self.gate = nn.Linear(d, args.num_experts, bias=False)
            # every rank builds all experts from the same seed (identical init whatever the world
            # size), then keeps only its own: the ModuleDict is keyed by the *global* expert id
            all_experts = [Expert(d, args.d_ff) for _ in range(args.num_experts)]
            self.experts = nn.ModuleDict(
                {str(g): all_experts[g] for g in range(first, first + per_rank)}
            )
            self.head = nn.Linear(d, args.classes)
            self.dispatcher = Dispatcher(args.num_experts, env.world_size, timer)
            self.aux_loss = None

        def moe(self, h):
            b, t, d = h.shape
            x = h.reshape(-1, d)
            probs = F.softmax(self.gate(x), dim=-1)  # [N, E]
            top_p, top_e = probs.topk(args.top_k, dim=-1)  # [N, k]
            top_p = top_p / top_p.sum(-1, keepdim=True)
            frac = (
                torch.bincount(top_e.reshape(-1), minlength=args.num_experts).float()
                / top_e.numel()
            )
            self.aux_loss = args.num_experts * (frac * probs.mean(0)).sum()  # 1.0 when balanced
            rows = x.repeat_interleave(args.top_k, dim=0)  # slot (token i, j) = row i*k+j
            received, local_e, state = self.dispatcher.dispatch(rows, top_e.reshape(-1))
            out = self.dispatcher.combine(
                run_experts(self.experts, received, local_e, first), state
            )
            return (out.view(-1, args.top_k, d) * top_p.unsqueeze(-1)).sum(1).view(b, t, d)

        def forward(self, tokens):
            h = self.embed(tokens.long()) + self.pos
            q = self.ln1(h)
            h = h + self.attn(q, q, q, need_weights=False)[0]
            h = h + self.moe(self.ln2(h))
            return self.head(h.mean(1))

    return MoEBlock(), first, per_rank


def grad_sync(dense, expert_params, world_size: int):
    """An optimizer step pre-hook. Dense: average over ranks. Experts: their backward already summed
    every rank's loss -> / W."""
    import torch
    import torch.distributed as dist

    def sync_grads(_opt, _args, _kwargs):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in dense]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world_size
        off = 0
        for p in dense:
            p.grad = flat[off : off + p.numel()].view_as(p).clone()
            off += p.numel()
        for p in expert_params:
            if p.grad is not None:
                p.grad /= world_size

    return sync_grads


class A2ALog:
    """fit()'s extra_log: the all-to-all share of wall time (mean over ranks) per logged window and
    for the run, the aux loss, and in final.json the expert layout (collective: every rank calls
    it)."""

    def __init__(self, args, model, timer, device, world_size: int, info: dict, log) -> None:
        self.args, self.model, self.timer, self.device, self.W, self.info, self.log = (
            args,
            model,
            timer,
            device,
            world_size,
            info,
            log,
        )
        self.t = self.t0 = time.perf_counter()
        self.a2a = 0.0

    def mean_over_ranks(self, *vals) -> list:
        import torch
        import torch.distributed as dist

        t = torch.tensor(vals, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return [v / self.W for v in t.tolist()]

    def __call__(self, kind: str) -> dict:
        now, timer = time.perf_counter(), self.timer
        if kind == "log":
            frac, aux = self.mean_over_ranks(
                (timer.seconds - self.a2a) / max(now - self.t, 1e-9),
                float(self.model.aux_loss.detach()),
            )
            self.t, self.a2a = now, timer.seconds
            self.log(
                f"  a2a_fraction {frac:.3f} (share of wall time in all-to-all, mean over ranks) "
                f"aux_loss {aux:.3f}"
            )
            return {"a2a_fraction": round(frac, 4), "aux_loss": round(aux, 4)}
        frac, secs = self.mean_over_ranks(timer.seconds / max(now - self.t0, 1e-9), timer.seconds)
        self.log(
            f"moe: all-to-all took {secs:.2f}s per rank = {frac:.1%} of the training loop "
            f"({timer.calls} calls)"
        )
        return {"a2a_fraction": round(frac, 4), "a2a_seconds": round(secs, 3), **self.info}


def placement(args, env, dense, expert_params, first: int, per_rank: int, log) -> tuple[int, list]:
    """Every rank's experts and parameter counts, gathered and said -> (dense parameters, each
    rank's info)."""
    import torch.distributed as dist

    n_dense = sum(p.numel() for p in dense)
    n_expert = sum(p.numel() for p in expert_params)
    info: list = [None] * env.world_size
    dist.all_gather_object(
        info,
        {
            "experts": list(range(first, first + per_rank)),
            "expert_params": n_expert,
            "dense_params": n_dense,
        },
    )
    print(
        f"moe-rank {env.rank}: experts {first}..{first + per_rank - 1} expert_params {n_expert} "
        f"dense_params {n_dense}",
        flush=True,
    )
    log(
        f"moe: {args.num_experts} experts over {env.world_size} ranks ({per_rank} each), "
        f"top-{args.top_k}, dense {n_dense} params (replicated), expert params per rank "
        f"{[i['expert_params'] for i in info]}"
    )
    return n_dense, info


def train(args, env, device, data, log) -> dict:
    import torch
    import torch.nn.functional as F

    from workloads.common.expert_parallel import A2ATimer, full_hash, roundtrip_check
    from workloads.common.loop import TorchSteps, fit, make_scheduler, total_steps
    from workloads.common.stateful import seed_all

    W = env.world_size
    timer = A2ATimer()
    torch.manual_seed(args.seed)  # identical dense init (and expert init) everywhere
    model, first, per_rank = build_model(args, env, timer)
    model = model.to(device)
    dense = [p for n, p in model.named_parameters() if not n.startswith("experts.")]
    expert_params = [p for n, p in model.named_parameters() if n.startswith("experts.")]
    seed_all(args.seed * 1_000_003 + 7919 * (env.rank + 1))
    roundtrip = roundtrip_check(model, env, device, args.d_model, log)
    timer.seconds, timer.calls = 0.0, 0

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    optimizer.register_step_pre_hook(grad_sync(dense, expert_params, W))
    scheduler = make_scheduler(optimizer, total_steps(args, len(data.train), W), args.warmup_steps)

    n_dense, info = placement(args, env, dense, expert_params, first, per_rank, log)

    def step_fn(m, xb, yb):
        logits = m(xb)
        return F.cross_entropy(logits, yb) + args.aux_coef * m.aux_loss, logits

    extra = A2ALog(
        args,
        model,
        timer,
        device,
        W,
        log=log,
        info={
            "a2a_roundtrip": roundtrip,
            "num_experts": args.num_experts,
            "top_k": args.top_k,
            "experts_per_rank": [i["experts"] for i in info],
            "expert_params_per_rank": [i["expert_params"] for i in info],
            "dense_params": n_dense,
        },
    )
    return fit(
        args=args,
        env=env,
        device=device,
        data=data,
        steps=TorchSteps(model, optimizer, scheduler, step_fn),
        eval_model=model,
        log=log,
        extra_log=extra,
        param_hash=lambda m: full_hash(m, W),
    )


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    env = wdist.read_env(args.run_dir)
    common_args.check(parser, args, env.world_size)
    check(parser, args, env.world_size)  # before the process group: all ranks agree

    return wdist.serve(
        "moe",
        env,
        args,
        lambda: make_data(args),
        train,
        lambda d: f"{args.seq_len} tokens per sample ",
    )


if __name__ == "__main__":
    sys.exit(main())
