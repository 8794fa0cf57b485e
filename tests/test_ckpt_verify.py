"""Checkpoints verified before use (launchers.ckptptr): the manifest written at commit, what a
resume loads when `latest` is damaged (a truncated shard, a missing shard, a flipped byte, a missing
metadata file, a step dir that is gone, every checkpoint damaged), checkpoints without a manifest;
then the real thing through `launch local` with the convnet workload: a damaged checkpoint shown as
damaged by `launch status`, the resume falling back bit-exact to the earlier complete one, and every
rank stopping in one line when none is left."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from conftest import assert_ranks_refused, read_json, run_launch
from launchers import ckptptr

SHARDS = {".metadata": b"M" * 40, "__0_0.distcp": b"a" * 300, "__1_0.distcp": b"b" * 280}


def make_step(ckpt: str, step: int, manifest: bool = True) -> str:
    name = f"step-{step:08d}"
    os.makedirs(os.path.join(ckpt, name))
    for rel, data in SHARDS.items():
        with open(os.path.join(ckpt, name, rel), "wb") as f:
            f.write(data + bytes([step]))
    if manifest:
        ckptptr.commit(ckpt, name)
    else:
        ckptptr.write_latest(ckpt, name)
    return name


@pytest.fixture
def ckpt(tmp_path):
    d = str(tmp_path / "checkpoints")
    for step in (10, 20, 30):
        make_step(d, step)
    return d


def truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def flip(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(7)
        b = f.read(1)
        f.seek(7)
        f.write(bytes([b[0] ^ 0x01]))


def garble(path: str) -> None:
    with open(path, "w") as f:
        f.write("{")


DAMAGE = {  # how -> (what to do to step-30, the words that name it)
    "truncated shard": (
        lambda p: truncate(os.path.join(p, "__1_0.distcp")),
        "/step-00000030/__1_0.distcp is 140 bytes, 281 when written (truncated)",
    ),
    "missing shard": (
        lambda p: os.unlink(os.path.join(p, "__0_0.distcp")),
        "/step-00000030/__0_0.distcp is missing",
    ),
    "flipped byte": (
        lambda p: flip(os.path.join(p, "__1_0.distcp")),
        "/step-00000030/__1_0.distcp does not match its xxh3_128",
    ),
    "missing metadata": (
        lambda p: os.unlink(os.path.join(p, ".metadata")),
        "/step-00000030/.metadata is missing",
    ),
    "step dir gone": (lambda p: shutil.rmtree(p), "/checkpoints/step-00000030 is missing"),
    "manifest garbled": (
        lambda p: garble(os.path.join(p, ckptptr.MANIFEST)),
        "manifest.json cannot be read",
    ),
}


def test_commit_writes_manifest_then_pointer(ckpt):
    man = read_json(os.path.join(ckpt, "step-00000030", ckptptr.MANIFEST))
    assert sorted(man["files"]) == sorted(SHARDS) and man["files"]["__0_0.distcp"]["size"] == 301
    assert ckptptr.read_latest(ckpt) == "step-00000030"
    assert ckptptr.check(ckpt, "step-00000030", (".metadata",)).state == "complete"
    assert ckptptr.resolve(ckpt, (".metadata",)) == ckptptr.Resolution("step-00000030")
    assert not [n for n in os.listdir(os.path.join(ckpt, "step-00000030")) if ".tmp" in n]


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_latest_falls_back_to_newest_complete(ckpt, how):
    damage, words = DAMAGE[how]
    damage(os.path.join(ckpt, "step-00000030"))
    v = ckptptr.check(ckpt, "step-00000030", (".metadata",))
    assert v.state == "damaged" and words in v.why, v
    res = ckptptr.resolve(ckpt, (".metadata",))
    assert res.name == "step-00000020" and not res.error
    assert res.note.startswith("skipped damaged checkpoint step-00000030 (") and words in res.note
    assert "resuming from step-00000020" in res.note and "\n" not in res.note


def test_flipped_byte_needs_hashes(ckpt):
    flip(os.path.join(ckpt, "step-00000030", "__0_0.distcp"))
    assert ckptptr.check(ckpt, "step-00000030", hashes=False).state == "complete"  # same size
    assert ckptptr.check(ckpt, "step-00000030", hashes=True).state == "damaged"


def test_sha256_stays_available_and_older_manifests_verify(tmp_path, monkeypatch):
    """Issue 38 item 4: manifests record xxh3_128 (the synchronous save waits for rank 0's hashing);
    sha256 on LAUNCH_CHECKPOINT_HASH=sha256, and a sha256 manifest (written before xxh3_128) is
    verified as before."""
    import hashlib

    d = str(tmp_path / "c")
    make_step(d, 10)
    files = read_json(os.path.join(d, "step-00000010", ckptptr.MANIFEST))["files"]
    assert (
        sorted(files[".metadata"]) == ["size", "xxh3_128"]
        and ckptptr.digest_of(d, "step-00000010") == "xxh3_128"
    )
    monkeypatch.setenv("LAUNCH_CHECKPOINT_HASH", "sha256")
    make_step(d, 20)
    files = read_json(os.path.join(d, "step-00000020", ckptptr.MANIFEST))["files"]
    assert (
        files[".metadata"]["sha256"]
        == hashlib.sha256(SHARDS[".metadata"] + bytes([20])).hexdigest()
    )
    monkeypatch.delenv("LAUNCH_CHECKPOINT_HASH")
    assert ckptptr.check(d, "step-00000020").state == "complete"
    flip(os.path.join(d, "step-00000020", "__0_0.distcp"))
    v = ckptptr.check(d, "step-00000020")
    assert v.state == "damaged" and v.why.endswith(
        "__0_0.distcp does not match its sha256 in manifest.json (its content changed)"
    ), v
    monkeypatch.setenv("LAUNCH_CHECKPOINT_HASH", "md5")
    with pytest.raises(
        ValueError,
        match=(
            r"^LAUNCH_CHECKPOINT_HASH='md5' is not accepted; accepted: xxh3_128, "
            r"sha256$"
        ),
    ):
        make_step(d, 30)


def test_skips_several_and_never_a_newer_uncommitted_step(ckpt):
    make_step(ckpt, 40)
    ckptptr.write_latest(ckpt, "step-00000030")  # 40 written but never committed as latest
    truncate(os.path.join(ckpt, "step-00000030", "__0_0.distcp"))
    os.unlink(os.path.join(ckpt, "step-00000020", ".metadata"))
    res = ckptptr.resolve(ckpt, (".metadata",))
    assert res.name == "step-00000010" and [s.name for s in res.skipped] == [
        "step-00000030",
        "step-00000020",
    ]
    assert "step-00000020" in res.note and "resuming from step-00000010" in res.note


def test_every_checkpoint_damaged_is_one_error_naming_the_file(ckpt):
    for step in (10, 20, 30):
        truncate(os.path.join(ckpt, f"step-{step:08d}", "__1_0.distcp"))
    res = ckptptr.resolve(ckpt, (".metadata",))
    assert res.name is None and not res.note
    bad = os.path.join(ckpt, "step-00000030", "__1_0.distcp")
    assert res.error.startswith(
        f"checkpoint step-00000030 (checkpoints/latest) is damaged: {bad} is 140 bytes"
    )
    assert (
        "step-00000010: " in res.error
        and os.path.join(ckpt, "latest") in res.error
        and "\n" not in res.error
    )


def test_without_manifest_loads_unverified(tmp_path):
    d = str(tmp_path / "old")
    make_step(d, 10, manifest=False)
    res = ckptptr.resolve(d, (".metadata",))
    assert res.name == "step-00000010" and not res.error
    assert res.note == (
        "loading checkpoint step-00000010 unverified: no manifest.json (written before "
        "checkpoints were verified)"
    )
    os.unlink(os.path.join(d, "step-00000010", ".metadata"))  # the format's own file still counts
    assert ckptptr.resolve(d, (".metadata",)).error


def test_no_pointer_starts_fresh(tmp_path):
    assert ckptptr.resolve(str(tmp_path / "none")) == ckptptr.Resolution(None)


# ---- through `launch local` with the convnet workload (1 node x 2 ranks, gloo)
# ------------------------------

SHAPE = ["--nodes", "1", "--gpus-per-node", "2"]
CONVNET = [
    "-m",
    "workloads.convnet",
    "--dataset",
    "digits",
    "--checkpoint-every",
    "10",
    "--seed",
    "7",
    "--no-tensorboard",
]


def attempt_lines(run_dir, attempt: int) -> dict[int, list[str]]:
    """rank -> the lines its log got in `attempt` (after that attempt's header)."""
    out = {}
    for log in sorted((run_dir / "logs").glob("node*/rank*.log")):
        text = log.read_text().split(f"===== launch attempt {attempt} |", 1)[1]
        out[int(log.stem[4:])] = (
            text.split("\n", 1)[1].split("===== launch attempt", 1)[0].splitlines()
        )
    return out


def status(run_dir: str) -> str:
    return run_launch("status", run_dir, check=True).stdout


def crashed_run(name: str, steps: int, crash: int) -> None:
    p = run_launch(
        "local",
        *SHAPE,
        "--run-dir",
        f"runs/{name}",
        "--",
        *CONVNET,
        "--max-steps",
        str(steps),
        "--crash-at-step",
        str(crash),
        "--crash-rank",
        "1",
    )
    assert p.returncode == 1, p.stderr[-3000:]


@pytest.mark.slow
def test_damaged_latest_is_shown_and_resume_falls_back_bit_exact(workdir):
    ref = run_launch("local", *SHAPE, "--run-dir", "runs/ref", "--", *CONVNET, "--max-steps", "30")
    assert ref.returncode == 0, ref.stderr[-3000:]
    crashed_run("c", 30, 25)  # latest: step-20, complete
    assert "checkpoint: step-00000020 (complete: xxh3_128 as written)" in status("runs/c")
    shard = workdir / "runs/c/checkpoints/step-00000020/__1_0.distcp"
    flip(str(shard))  # same size: only the digest tells
    st = run_launch("status", "runs/c", check=True).stdout
    assert (
        f"checkpoint: step-00000020 DAMAGED ({shard} does not match its xxh3_128 in "
        "manifest.json (its content changed)); a resume uses step-00000010"
    ) in st, st
    ck = __import__("json").loads(run_launch("status", "runs/c", "--json", check=True).stdout)[
        "checkpoint"
    ]
    assert (
        ck["state"] == "damaged"
        and ck["resume_from"] == "step-00000010"
        and ck["checked"] == "xxh3_128"
    )

    res = run_launch("resume", "runs/c", "--", *CONVNET, "--max-steps", "30")
    assert res.returncode == 0, res.stderr[-3000:]
    rank0 = attempt_lines(workdir / "runs/c", 1)[0]
    assert (
        f"skipped damaged checkpoint step-00000020 ({shard} does not match its xxh3_128 in "
        "manifest.json (its content changed)); resuming from step-00000010, the newest complete "
        "checkpoint before it"
    ) in rank0
    assert "resumed from step-00000010" in "\n".join(rank0)
    assert (
        read_json("runs/c/final.json")["param_sha256"]
        == read_json("runs/ref/final.json")["param_sha256"]
    )
    assert "checkpoint: step-00000030 (complete: xxh3_128 as written)" in status("runs/c")


@pytest.mark.slow
def test_no_complete_checkpoint_stops_every_rank_in_one_line(workdir):
    crashed_run("d", 20, 15)  # latest: step-10, the only checkpoint
    step = workdir / "runs/d/checkpoints/step-00000010"
    shard = step / "__0_0.distcp"
    whole = shard.read_bytes()
    truncate(str(shard))
    st = run_launch("status", "runs/d", check=True).stdout
    why = f"{shard} is {len(whole) // 2} bytes, {len(whole)} when written (truncated)"
    assert (
        f"checkpoint: step-00000010 DAMAGED ({why}); no complete checkpoint to resume from" in st
    ), st

    res = run_launch("resume", "runs/d", "--", *CONVNET, "--max-steps", "20")
    assert res.returncode == 1 and re.fullmatch(
        r"(launch: --dist-backend auto -> no GPU on any node: gloo on CPU\n)?"
        r"launch: run FAILED \(rank [01] on node 0, exit code 2\)\n",
        res.stderr,
    ), res.stderr
    want = (
        f"error: checkpoint step-00000010 (checkpoints/latest) is damaged: {why}; no complete "
        f"earlier checkpoint (others: none); remove {workdir}/runs/d/checkpoints/latest to start "
        "from scratch"
    )
    # every rank decides the same and exits 2 (one stopped by the agent before it printed may say
    # nothing)
    assert_ranks_refused(workdir / "runs/d", "error: ", want, world=2)
    lines = attempt_lines(workdir / "runs/d", 1)
    assert all(sum(ln == want for ln in lines[r]) <= 1 for r in lines), lines
    assert not [ln for r in lines for ln in lines[r] if "Traceback" in ln], lines
    assert (workdir / "runs/d/checkpoints/latest").read_text() == "step-00000010\n"  # nothing moved

    shard.write_bytes(whole)  # whole again, but as an earlier version wrote it:
    (step / ckptptr.MANIFEST).unlink()  # no manifest
    assert (
        "checkpoint: step-00000010 (unverified: no manifest.json"
        in run_launch("status", "runs/d").stdout
    )
    res = run_launch("resume", "runs/d", "--", *CONVNET, "--max-steps", "20")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "loading checkpoint step-00000010 unverified: no manifest.json (written before "
        "checkpoints were verified)"
    ) in attempt_lines(workdir / "runs/d", 2)[0]
    assert read_json("runs/d/final.json")["step"] == 20
