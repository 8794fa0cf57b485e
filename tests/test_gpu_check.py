"""bench/gpu_check.sh (issue 33 item 7) where no GPU is lent: its launch lines are still launch's
own (each checked by `--dry-run`, the two --dist-backend auto ones saying the backend is decided on
the node), and without a GPU it ends at once in one clear verdict, exit 2. The GPU run itself needs
a GPU machine: `bash bench/gpu_check.sh`."""

from __future__ import annotations

import shutil
import subprocess

from conftest import ROOT

SCRIPT = str(ROOT / "bench" / "gpu_check.sh")


def test_gpu_check_dry_run_accepts_every_launch_line_and_says_no_gpu_here():
    assert subprocess.run(["bash", "-n", SCRIPT], capture_output=True, timeout=30).returncode == 0
    p = subprocess.run(
        ["bash", SCRIPT, "--dry-run"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    dry = [ln for ln in p.stdout.splitlines() if ln.startswith("gpu_check: DRY ")]
    assert [ln.split()[2] for ln in dry] == [
        "convnet-auto:",
        "ddp-auto:",
        "convnet:",
        "zero2:",
        "fsdp2:",
    ], p.stdout
    assert all(" accepted (world:   1 nodes x 1 processes = 1" in ln for ln in dry), p.stdout
    assert (
        sum(
            "auto: decided on each node (nccl where the node has GPUs, else gloo)" in ln
            for ln in dry
        )
        == 2
    )
    if shutil.which("nvidia-smi") is None:  # this CPU machine: the verdict, nothing run
        assert p.returncode == 2 and p.stderr.strip() == (
            "gpu_check: no GPU here: nvidia-smi is not on PATH (this "
            "script needs an NVIDIA GPU machine)"
        ), p.stderr
    else:
        assert p.returncode in (0, 2), p.stderr


def test_gpu_check_refuses_an_unknown_argument_in_one_line():
    p = subprocess.run(["bash", SCRIPT, "--gpus"], capture_output=True, text=True, timeout=30)
    assert (
        p.returncode == 2
        and p.stderr == "gpu_check: --gpus is not accepted; give nothing or --dry-run\n"
    )
