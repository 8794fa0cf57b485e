"""--snapshot (launchers.frozen.snapshot) and the run manifest (launchers.records.manifest).

Pure: which files a snapshot takes (a temp git repo; a plain directory with .launchignore), its
content hash, the content-addressed store (same content = same dir, no copy; written atomically),
resume's choice, the bad inputs, rank 0's node part. One real `launch local` run and its resume (1
node x 1 process): the ranks run from the snapshot, an edit after submit does not reach a resume
that keeps it, manifest.json holds the right values.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from conftest import rank_lines, run_launch
from launchers import api, rankexec
from launchers.errors import LaunchError
from launchers.frozen import snapshot, snaptree
from launchers.options.profiles import load_profile
from launchers.records import manifest
from launchers.spec import RunSpec, build_spec


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.fixture
def repo(tmp_path):
    """A git work tree: tracked, untracked-not-ignored, ignored and deleted-tracked files, a runs
    root inside."""
    r = tmp_path / "repo"
    write(
        r,
        {
            "train.py": "print(1)\n",
            "pkg/mod.py": "X = 1\n",
            ".gitignore": "*.log\ndata/\n",
            "gone.py": "",
            "runs/old/run.yaml": "x\n",
        },
    )
    git(r, "init", "-q")
    git(r, "add", "train.py", "pkg/mod.py", ".gitignore", "gone.py")
    git(r, "commit", "-qm", "c")
    write(
        r,
        {"new.py": "", "x.log": "", "data/big.bin": "", "pkg/__pycache__/mod.cpython-311.pyc": ""},
    )
    (r / "gone.py").unlink()
    return r


def test_git_tree_files_hash_and_store(repo, tmp_path):
    snap = snapshot.scan(str(repo), exclude=(str(repo / "runs"),))
    # -co --exclude-standard, runs out
    assert snap.files == (".gitignore", "new.py", "pkg/mod.py", "train.py")
    again = snapshot.scan(str(repo), exclude=(str(repo / "runs"),))
    assert again.digest == snap.digest and len(snap.digest) == 64
    store = str(tmp_path / "store")
    d = snapshot.write(snap, store)
    # no temp left
    assert d == os.path.join(store, snap.digest) and sorted(os.listdir(store)) == [snap.digest]
    assert (Path(d) / "pkg/mod.py").read_text() == "X = 1\n" and not os.stat(
        Path(d) / "train.py"
    ).st_mode & 0o222
    ino = os.stat(Path(d) / "train.py").st_ino
    # reused, no copy
    assert snapshot.write(again, store) == d and os.stat(Path(d) / "train.py").st_ino == ino
    (repo / "x.log").write_text("ignored: same content\n")
    assert snapshot.scan(str(repo), exclude=(str(repo / "runs"),)).digest == snap.digest
    for change in (
        lambda: (repo / "new.py").write_text("y"),
        lambda: os.chmod(repo / "train.py", 0o755),
    ):
        change()
        changed = snapshot.scan(str(repo), exclude=(str(repo / "runs"),))
        assert changed.digest != snap.digest
        snap = changed


def test_plain_directory_uses_launchignore(tmp_path):
    write(
        tmp_path,
        {
            "a.py": "",
            "notes.tmp": "",
            "cache/x.py": "",
            "sub/cache/y.py": "",
            "sub/keep.py": "",
            "sub/gen/z.py": "",
            "__pycache__/a.pyc": "",
            ".launchignore": "# c\n*.tmp\ncache/\nsub/gen\n",
        },
    )
    assert snapshot.scan(str(tmp_path)).files == (".launchignore", "a.py", "sub/keep.py")


def test_virtualenvs_and_output_dirs_are_left_out_by_default_and_the_dry_run_says_what_is_copied(
    tmp_path,
):
    """Issue 38: a project without git holding a virtualenv, W&B's and Hydra's output directories:
    they are left out (said, with why) unless .launchinclude names them; the dry-run's line says the
    files, the bytes and the largest entries of what is copied."""
    write(
        tmp_path,
        {
            "train.py": "print(1)\n",
            "venv/pyvenv.cfg": "home = /usr\n",
            "venv/lib/big.py": "x" * 5000,
            "conda/conda-meta/history": "",
            "conda/bin/python": "",
            "wandb/run-1/log": "l",
            "outputs/2026-12-06/.hydra/config.yaml": "a: 1\n",
            "pkg/outputs.py": "Y = 2\n",
            "data/d.bin": "d" * 3000,
        },
    )
    snap = snapshot.scan(str(tmp_path))
    assert snap.files == ("data/d.bin", "pkg/outputs.py", "train.py"), snap.files
    assert sorted(snap.left_out) == [
        ("conda/", snaptree.VENV),
        ("outputs/", snaptree.OUTPUT),
        ("venv/", snaptree.VENV),
        ("wandb/", snaptree.OUTPUT),
    ]
    assert snapshot.held(snap) == "3 files, 2.9 KiB; largest: data/ 2.9 KiB, train.py 9 B, pkg/ 6 B"
    (tmp_path / ".launchinclude").write_text("wandb/\n")
    assert "wandb/run-1/log" in snapshot.scan(str(tmp_path)).files


def test_run_dirs_and_stores_never_belong_to_the_tree_wherever_they_are(tmp_path, monkeypatch):
    """A run dir outside the runs root puts its store beside it, next to the program (the Slurm
    security test found the program's own directory left out): only run dirs (launch's lock) and
    stores are left out."""
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path,
        {
            "code/train.py": "",
            "code/old/run.yaml": "",
            "code/old/status/.lock": "",
            "code/old/logs/a.log": "",
            "code/.snapshots/h/x": "",
            "runs/r1/run.yaml": "",
            "runs/r1/status/.lock": "",
            "runs/r1/checkpoints/c": "",
            "runs/.snapshots/h/y": "",
            "lib/u.py": "",
            # a run dir being made
            "making/status/.lock": "",
            "making/status.json": "",
            "cfg/status.json": "",
            "lib/v.py.tmp.42": "",
        },
    )
    sp = build_spec("slurm", {"run_dir": str(tmp_path / "code/new")}, ["code/train.py"])
    assert sp.snapshot == str(tmp_path / "code/.snapshots")
    assert snapshot.take(sp).snapshot_dir and snapshot.scan(
        str(tmp_path), (sp.snapshot, sp.run_dir)
    ).files == (
        "cfg/status.json",
        "code/train.py",
        "lib/u.py",
        # a user's own status.json
        # stays
        "lib/v.py.tmp.42",
    )


def test_store_resume_choice_and_refusals(repo, tmp_path, monkeypatch):
    monkeypatch.chdir(repo)  # the tree is the launch directory
    assert snapshot.store_for("/r/runs/x", "/r/runs") == "/r/runs/.snapshots"
    assert snapshot.store_for("/elsewhere/x", "/r/runs") == "/elsewhere/.snapshots"
    spec = RunSpec(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=(str(repo / "train.py"),),
        program_args=(),
        run_dir=str(repo / "runs/a"),
        name="a",
        snapshot=str(repo / "runs/.snapshots"),
    )
    taken = snapshot.take(spec)  # named (a dry-run shows it); nothing written before commit
    assert taken.snapshot_dir.startswith(spec.snapshot + "/") and not os.path.exists(spec.snapshot)
    assert taken.snapshot_from == str(repo)
    assert snapshot.for_resume(taken, None, "/s") is taken  # kept
    assert snapshot.for_resume(taken, False, "/s").snapshot == ""  # --no-snapshot
    new = snapshot.for_resume(taken, True, "/s")  # --snapshot: a new one
    assert (new.snapshot, new.snapshot_dir, new.snapshot_from) == (spec.snapshot, "", str(repo))
    (repo / "new.py").write_text("edited between the plan and the copy\n")
    with pytest.raises(LaunchError, match="changed while its snapshot was taken"):
        snapshot.commit(taken)
    again = snapshot.take(spec)
    snapshot.commit(again)
    # a resume keeping it
    assert os.path.isdir(again.snapshot_dir) and snapshot.take(again) is again
    with pytest.raises(
        LaunchError, match="snapshot .* is gone; accepted: `launch resume --snapshot`"
    ):
        snapshot.take(spec.replace(snapshot_dir=str(tmp_path / "deleted")))
    for prog, why in (
        (str(tmp_path / "t.py"), "is outside the snapshot"),
        (str(repo / "x.log"), "is left out of"),
    ):
        with pytest.raises(LaunchError, match=why):
            snapshot.take(spec.replace(program=(prog,)))
    with pytest.raises(LaunchError, match="--snapshot is not accepted with --no-shared-storage"):
        snapshot.take(spec.replace(backend="ssh", options=(("shared_storage", False),)))
    with pytest.raises(LaunchError, match="its snapshot /nowhere is not on this node"):
        rankexec.snapshot_dir({"LAUNCH_SNAPSHOT_DIR": "/nowhere"})


@pytest.mark.parametrize(
    "case,needle",
    [
        ("profile", "snapshot has a value of the wrong type: 'yes'; expected bool"),
        (
            "env",
            "--env LAUNCH_SNAPSHOT_DIR is set by launch for every worker; give it with --snapshot",
        ),
    ],
)
def test_bad_input_one_line(workdir, case, needle):
    (workdir / "p.yaml").write_text("snapshot: 'yes'\n")
    with pytest.raises(LaunchError) as e:
        if case == "profile":
            load_profile("p.yaml")
        else:
            build_spec("local", {"env": ("LAUNCH_SNAPSHOT_DIR=/x",)}, ["report.py"])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_defaults_by_backend(workdir):
    specs = {
        b: build_spec(b, {"run_dir": "runs/x"}, ["report.py"]) for b in ("local", "ssh", "slurm")
    }
    assert [bool(specs[b].snapshot) for b in ("local", "ssh", "slurm")] == [False, False, True]
    assert specs["slurm"].snapshot == str(workdir / "runs/.snapshots")
    assert not build_spec("slurm", {"run_dir": "runs/x", "snapshot": False}, ["report.py"]).snapshot


def test_packages_list_is_what_importlib_metadata_says():
    """The fast header read names the same distributions and versions as importlib.metadata's full
    parse, and reads a METADATA whose Version comes first, or whose body holds other Name: lines,
    right."""
    slow = {}
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "").strip()
        if name:
            slow.setdefault(re.sub(r"[-_.]+", "-", name).lower(), d.version)
    assert manifest.packages() == sorted(f"{n}=={v}" for n, v in slow.items()) and len(slow) > 10
    text = (
        "Metadata-Version: 2.1\nVersion: 1.2\nName: a_b\nSummary: x\n\nName: not-me\nVersion: 9\n"
    )
    assert manifest._headers(text) == {"version": " 1.2", "name": " a_b"}
    assert manifest._headers("Name: only\n\nVersion: 3\n") == {"name": " only"}


def test_node_part_and_command_line():
    text = "".join(p + "\n" for p in manifest.packages())
    node = manifest.node_part(3, text)
    assert node["torch"] == metadata.version("torch") and node["attempt"] == 3
    assert node["packages_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert f"torch=={metadata.version('torch')}" in text.splitlines()
    assert (node["cuda"] is None) == ("+cpu" in node["torch"]) and (
        node["nccl"] is None or node["cuda"]
    )
    line = manifest.command_line(
        ["/venv/bin/launch", "local", "--env", "HF_TOKEN=abc", "--", "t.py"]
    )
    assert line == "launch local --env 'HF_TOKEN=***' -- t.py"


def test_runs_from_snapshot_edit_does_not_reach_a_kept_resume_and_manifest(workdir):
    """Real: launch local --snapshot (1x1), edit the program, resume keeping the snapshot; the
    manifest."""
    write(
        workdir,
        {
            "snapprog.py": (
                "import os, snaphelp\nprint('SNAP', __file__, os.getcwd(), "
                "snaphelp.V, flush=True)\n"
            ),
            "snaphelp.py": "V = 'one'\n",
        },
    )
    git(workdir, "init", "-q")
    git(workdir, "add", "snapprog.py", "snaphelp.py", "report.py")
    git(workdir, "commit", "-qm", "c")
    # uncommitted change
    (workdir / "report.py").write_text((workdir / "report.py").read_text() + "# dirty\n")
    p = run_launch(
        "local",
        "--snapshot",
        "--run-dir",
        "runs/s",
        "--env",
        "NCCL_DEBUG=WARN",
        "--",
        "snapprog.py",
        check=True,
    )
    run = workdir / "runs/s"
    ((_, f1, cwd1, v1),) = [ln.split() for ln in rank_lines(run, "SNAP")]
    diff = subprocess.run(
        ["git", "-C", str(workdir), "diff", "HEAD", "--binary"], capture_output=True
    ).stdout
    sdir = json.loads(run_launch("status", str(run), "--json").stdout)["snapshot"]
    assert sdir.startswith(str(workdir / "runs/.snapshots") + "/") and (f1, cwd1, v1) == (
        f"{sdir}/snapprog.py",
        str(run / "work"),
        "one",
    )
    (workdir / "snaphelp.py").write_text("V = 'two'\n")
    run_launch("resume", str(run), check=True)
    assert [ln.split()[1:] for ln in rank_lines(run, "SNAP")] == [[f1, cwd1, "one"]] * 2
    # git fields: the kept snapshot's, not the edit's
    m = json.loads((run / "manifest.json").read_text())
    assert m["git_commit"] == git(workdir, "rev-parse", "HEAD").strip() and m["git_dirty"] is True
    assert m["git_diff_sha256"] == hashlib.sha256(diff).hexdigest() and m[
        "snapshot"
    ] == os.path.basename(sdir)
    assert (
        m["container_image"] is None
        and m["nccl_env"] == {"NCCL_DEBUG": "WARN"}
        and len(m["hosts"]) == 1
    )
    assert m["command_line"].startswith("launch resume ") and p.returncode == 0
    node = m["node"]
    assert node["attempt"] == 1 and node["torch"] == metadata.version("torch") and node["python"]
    assert (
        node["packages_sha256"] == hashlib.sha256((run / "packages.txt").read_bytes()).hexdigest()
    )
    shown = run_launch("status", str(run), "--manifest", check=True).stdout
    assert f"snapshot:   {os.path.basename(sdir)}" in shown and f"torch {node['torch']}" in shown
    # resume --snapshot: a new snapshot of the edited tree (dry-run: in-process)
    out = io.StringIO()
    api.resume(str(run), {"snapshot": True}, dry_run=True, out=out)
    new = out.getvalue().splitlines()[0].split()[2]
    assert new != sdir and f"{new}/snapprog.py" in out.getvalue() and not os.path.exists(new)
