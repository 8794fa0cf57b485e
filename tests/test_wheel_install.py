"""Installed at a site (issue 33 item 5): the wheel built from this tree, pip-installed without root
into a fresh venv whose torch is not the pinned one, runs a local job and a Slurm dry-run.

The site's environment: Debian's python3 (any user may run it; the pyenv one lives under /root,
0700) with torch 2.14.1, a CUDA build with its nvidia-* wheels (~5.5 GB), on a machine without a
GPU: a login node's case. It is built once, as root, into a cache outside the repo
(LAUNCH_TEST_CACHE, default /var/cache/launchers-test: venv-torch-<version>/, stamped `.complete`
when whole; rebuilt when missing), from the wheels on this disk (/opt/pypi*/files), what is not
there (cuda-bindings) from the ordinary index. It is read-only to the user: each run makes a fresh
venv owned by the user (`launchwheel`, made here) that sees the cached torch through a .pth
(`site.addsitedir`), so pip cannot replace that torch, and a torch pip put into the user's venv
would be seen. The wheel's dependencies come from a wheelhouse made once per set of requirements
(`pip download`, pinned by requirements.txt); the user's `pip install` is `--no-index` over it, the
wheel's folder and /opt/wheels (where the pinned torch 2.13.0 CPU lies: a pin or an upper bound on
torch would pull it in).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

TORCH = "2.14.1"  # the site's torch; the repo's .venv pins 2.13.0 (CPU)
DISK = ("/opt/pypi-more/files", "/opt/pypi/files", "/opt/wheels")
OFF_DISK = ("cuda-bindings",)  # a torch requirement with no wheel on this disk: from the index
CACHE = Path(os.environ.get("LAUNCH_TEST_CACHE", "/var/cache/launchers-test"))
SITE_PY = "/usr/bin/python3"
USER = "launchwheel"
EXTRAS = "slurm,ssh"
FIGURES: dict[str, object] = {}

REPORT = """\
import json, os, torch, torch.distributed as dist
dist.init_process_group(os.environ.get("LAUNCH_DIST_BACKEND", "gloo"))
t = torch.ones(1)
dist.all_reduce(t)
print("WHEEL " + json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
      "torch": torch.__version__, "torch_file": torch.__file__, "cuda_build": torch.version.cuda,
      "backend": dist.get_backend(), "uid": os.getuid()}), flush=True)
dist.destroy_process_group()
"""  # noqa: E501


def sh(
    argv, timeout=900, env=None, cwd=None, user=None, venv="venv", ok=True
) -> subprocess.CompletedProcess:
    """Run argv (as `user`: (uid, gid, home), with a clean environment and home/venv/bin first on
    PATH); unless ok=False, fail the test with its output when it fails."""
    if user:
        uid, gid, home = user
        venv = f"{home}/{venv}/bin"
        argv = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "env",
            "-i",
            f"HOME={home}",
            f"PATH={venv}:/usr/bin:/bin",
            "PIP_CONFIG_FILE=/dev/null",
            "PIP_DISABLE_PIP_VERSION_CHECK=1",
            "LANG=C.UTF-8",
            *[f"{k}={v}" for k, v in (env or {}).items()],
            *argv,
        ]
        env = None
    p = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        umask=0o022,
        env=None if env is None else {**os.environ, **env},
    )
    if ok and p.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, argv))} exited "
            f"{p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}",
            pytrace=False,
        )
    return p


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def locked(name: str):
    CACHE.mkdir(parents=True, exist_ok=True)
    f = open(CACHE / f"{name}.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def torch_venv() -> Path:
    """The cached venv holding torch TORCH (built when its stamp is missing); its build time and
    size."""
    base = CACHE / f"venv-torch-{TORCH}"
    with locked(base.name):
        if not (base / ".complete").exists():
            t0 = time.monotonic()
            shutil.rmtree(base, ignore_errors=True)
            sh([SITE_PY, "-m", "venv", str(base)])
            py = str(base / "bin/python")
            links = [a for d in DISK for a in ("--find-links", d)]
            sh(
                [
                    py,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-index",
                    *links,
                    "--no-deps",
                    f"torch=={TORCH}",
                ]
            )
            reqs = sh(
                [
                    py,
                    "-c",
                    "import importlib.metadata as m; from pip._vendor.packaging.requirements "
                    "import Requirement as R; print('\\n'.join(r for r in m.requires('torch') if "
                    "not R(r).marker or R(r).marker.evaluate({'extra': ''})))",
                ]
            ).stdout.split("\n")
            on_disk = [r for r in reqs if r.strip() and not r.startswith(OFF_DISK)]
            sh([py, "-m", "pip", "install", "-q", "--no-index", *links, *on_disk])
            sh([py, "-m", "pip", "install", "-q", f"torch=={TORCH}"])  # what is not on this disk
            sh([py, "-m", "pip", "check"])
            stamp = {"seconds": round(time.monotonic() - t0, 1), "bytes": du(base)}
            (base / ".complete").write_text(json.dumps(stamp))
        FIGURES["torch venv (one-off)"] = json.loads((base / ".complete").read_text())
    return base


def build_wheel(out: Path) -> Path:
    """The wheel of the tree as a commit would hold it (tracked and untracked-not-ignored files),
    built outside it with the dev venv's setuptools (no build isolation, nothing downloaded)."""
    src = out / "src"
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "-co", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    sh(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out / "dist"),
            str(src),
        ]
    )
    (wheel,) = (out / "dist").glob("launchers-*.whl")
    return wheel


def wheelhouse(wheel: Path) -> Path:
    """The wheel's dependencies (every extra), downloaded once per set of requirements, as
    requirements.txt pins."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = sorted(
        ln for ln in meta.splitlines() if ln.startswith(("Requires-Dist:", "Provides-Extra:"))
    )
    pins = (ROOT / "requirements.txt").read_text()
    key = hashlib.sha256("\n".join([*reqs, pins]).encode()).hexdigest()[:12]
    house = CACHE / f"wheelhouse-{key}"
    with locked(house.name):
        if not (house / ".complete").exists():
            shutil.rmtree(house, ignore_errors=True)
            extras = ",".join(
                ln.split(":", 1)[1].strip() for ln in reqs if ln.startswith("Provides-Extra:")
            )
            sh(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "-d",
                    str(house),
                    "-c",
                    str(ROOT / "requirements.txt"),
                    f"{wheel}[{extras}]",
                ]
            )
            for own in house.glob("launchers-*"):
                own.unlink()
            (house / ".complete").write_text("")
            for old in CACHE.glob("wheelhouse-*"):  # those of earlier requirements
                if old.is_dir() and old != house:
                    shutil.rmtree(old, ignore_errors=True)
    return house


def site_user() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        sh(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ]
        )
        pw = pwd.getpwnam(USER)
    return pw.pw_uid, pw.pw_gid


def user_venv(site, name: str) -> None:
    """A fresh venv of the user's that sees the site's torch (read-only to the user) through a
    .pth."""
    user = site["user"]
    sh([SITE_PY, "-m", "venv", f"{site['home']}/{name}"], user=user)
    pth = site_packages(site["home"] / name) / "site-torch.pth"
    sh(
        [
            "sh",
            "-c",
            f"echo \"import site; site.addsitedir('{site_packages(site['base'])}')\" > {pth}",
        ],
        user=user,
    )
    # the venv's bundled setuptools would shadow the one torch brought (a real env holds one): pip
    # check
    sh(["pip", "uninstall", "-q", "-y", "setuptools"], user=user, venv=name)


def pip_install(site, what: str, venv: str = "venv") -> None:
    """As the user, from the wheel's folder, the wheelhouse and /opt/wheels (torch 2.13.0) only."""
    sh(
        [
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(site["wheel"].parent),
            "--find-links",
            str(site["house"]),
            "--find-links",
            "/opt/wheels",
            what,
        ],
        user=site["user"],
        venv=venv,
    )


@pytest.fixture(scope="module")
def site():
    """A user's fresh venv beside the cached torch, with `launchers[slurm,ssh]` installed from the
    wheel."""
    if os.geteuid() != 0:
        pytest.fail(
            "tests/test_wheel_install.py makes a user and a cache in /var/cache: run it as root "
            "(as CI does)",
            pytrace=False,
        )
    assert importlib.metadata.version("torch").split("+")[0] != TORCH, (
        "the site's torch must differ from .venv's"
    )
    base = torch_venv()
    uid, gid = site_user()
    home = Path(tempfile.mkdtemp(prefix="launch-wheel-"))
    try:
        wheel = build_wheel(home)
        FIGURES["wheel bytes"] = wheel.stat().st_size
        house = wheelhouse(wheel)
        subprocess.run(["chown", "-R", f"{uid}:{gid}", str(home)], check=True)
        os.chmod(home, 0o700)
        user = (uid, gid, str(home))
        env = {"home": home, "user": user, "base": base, "wheel": wheel, "house": house}
        user_venv(env, "venv")
        t0 = time.monotonic()
        pip_install(env, f"launchers[{EXTRAS}]")
        FIGURES["wheel install (s)"] = round(time.monotonic() - t0, 1)
        FIGURES["user venv bytes"] = du(home / "venv")
        yield env
    finally:
        print("\nfigures: " + json.dumps(FIGURES))
        shutil.rmtree(home, ignore_errors=True)


def test_wheel_holds_what_the_nodes_need(site):
    with zipfile.ZipFile(site["wheel"]) as z:
        names = set(z.namelist())
    for need in (
        "launchers/backends/slurm/task.py",
        "launchers/rankexec.py",
        "launchers/remote.py",
        "nccl_tuning/presets/default.yaml",
        "nccl_tuning/data/nccl_env_removed.txt",
        "workloads/convnet.py",
        "workloads/configs/ds_zero.json",
    ):
        assert need in names, need
    assert not [n for n in names if n.startswith(("tests/", "slurm/", "clusters/", "bench/"))]
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(site["wheel"]) as z:
        requires = [
            ln for ln in z.read(meta).decode().splitlines() if ln.startswith("Requires-Dist:")
        ]
    assert not [r for r in requires if r.split()[1].lower().startswith("torch")], requires


def test_installs_beside_the_sites_torch_without_root(site):
    home, user = site["home"], site["user"]
    sp = site_packages(home / "venv")
    assert not list(sp.glob("torch*")), "pip put a torch into the user's venv"
    assert (sp / "launchers").is_dir() and (home / "venv/bin/launch").exists()
    p = sh(
        [
            "python",
            "-c",
            "import torch, launchers; print(torch.__version__, torch.version.cuda, torch.__file__)",
        ],
        user=user,
    )
    version, cuda, where = p.stdout.split()
    assert (
        version.split("+")[0] == TORCH and cuda != "None" and where.startswith(str(site["base"]))
    ), p.stdout
    sh(["pip", "check"], user=user)


def test_local_job_from_the_wheel(site):
    home, user = site["home"], site["user"]
    work = home / "work"
    work.mkdir()
    (work / "report.py").write_text(REPORT)
    subprocess.run(["chown", "-R", f"{user[0]}:{user[1]}", str(work)], check=True)
    p = sh(
        [
            "launch",
            "local",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--run-dir",
            "runs/w",
            "--",
            "report.py",
        ],
        user=user,
        cwd=work,
        timeout=300,
    )
    reps = sorted(
        (json.loads(ln.split("WHEEL ", 1)[1]) for ln in p.stdout.splitlines() if "WHEEL " in ln),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in reps] == [0, 1] and {r["world"] for r in reps} == {2}, p.stdout
    assert {r["sum"] for r in reps} == {2.0} and {r["torch"].split("+")[0] for r in reps} == {TORCH}
    assert {r["uid"] for r in reps} == {user[0]} and all(
        r["torch_file"].startswith(str(site["base"])) for r in reps
    )
    st = json.loads((work / "runs/w/status.json").read_text())
    assert st["state"] == "COMPLETED" and st["first_failure"] is None, st
    s = sh(["launch", "status", "runs/w"], user=user, cwd=work).stdout
    assert "COMPLETED" in s


def test_slurm_dry_run_from_the_wheel(site):
    home, user = site["home"], site["user"]
    work = home / "dry"
    work.mkdir()
    (work / "train.py").write_text("print('train')\n")
    subprocess.run(["chown", "-R", f"{user[0]}:{user[1]}", str(work)], check=True)
    p = sh(
        ["launch", "slurm", "--nodes", "2", "--gpus-per-node", "8", "--dry-run", "--", "train.py"],
        user=user,
        cwd=work,
    )
    out = p.stdout
    assert "#SBATCH --nodes=2" in out and "#SBATCH --gpus-per-node=8" in out and "= 16" in out, out
    assert f"{home}/venv/bin/python" in out and out.count("torch.distributed.run") == 2, out
    assert not (work / "runs").exists()


def test_workloads_extra_runs_the_readmes_first_example(site):
    """`-m workloads.convnet` (docs/CLI.md's first command) needs numpy, scikit-learn's digits and
    tensorboard, which a site's torch does not bring: the `workloads` extra does."""
    home, user = site["home"], site["user"]
    t0 = time.monotonic()
    pip_install(site, "launchers[workloads]")
    FIGURES["workloads extra install (s)"] = round(time.monotonic() - t0, 1)
    assert not list(site_packages(home / "venv").glob("torch*")), (
        "pip put a torch into the user's venv"
    )
    work = home / "convnet"
    work.mkdir()
    subprocess.run(["chown", "-R", f"{user[0]}:{user[1]}", str(work)], check=True)
    sh(
        [
            "launch",
            "local",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--run-dir",
            "runs/c",
            "--",
            "-m",
            "workloads.convnet",
            "--max-steps",
            "3",
            "--batch-size",
            "8",
        ],
        user=user,
        cwd=work,
        timeout=600,
    )
    st = json.loads((work / "runs/c/status.json").read_text())
    assert st["state"] == "COMPLETED", st
    lines = (work / "runs/c/metrics.jsonl").read_text().splitlines()
    assert lines and (work / "runs/c/tensorboard/rank1").is_dir()


def test_without_an_extra_one_line_names_it(site):
    """`pip install launchers` alone (a laptop that only uses --cluster): a Slurm dry-run works; the
    backends whose extra is missing say which in one line (exit 2), nothing started."""
    home, user = site["home"], site["user"]
    user_venv(site, "bare")
    pip_install(site, "launchers", venv="bare")
    work = home / "bare-work"
    work.mkdir()
    (work / "train.py").write_text("print('train')\n")
    subprocess.run(["chown", "-R", f"{user[0]}:{user[1]}", str(work)], check=True)
    for argv, extra in (
        (["slurm", "--nodes", "1", "--", "train.py"], "slurm"),
        (["ssh", "--hosts", "h1,h2", "--", "train.py"], "ssh"),
    ):
        p = sh(["launch", *argv], user=user, venv="bare", cwd=work, ok=False)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert f"pip install 'launchers[{extra}]'" in p.stderr, p.stderr
    sh(
        ["launch", "slurm", "--nodes", "2", "--gpus-per-node", "8", "--dry-run", "--", "train.py"],
        user=user,
        venv="bare",
        cwd=work,
    )
    assert not (work / "runs").exists()
