"""Issue 35 items 2 and 6: a snapshot is used only when it is the user's and hashes to its name,
runs never write into the store (their relative writes land in the run's own work/), the shared
extension cache is checked before use; the tree's rules users expect: secret-looking files left out
unless named (.launchinclude), run dirs recognized by launch's own records (not by a file name),
nothing left out silently (the dry-run says what and why), `*.tmp.<digits>` kept, a symlinked
program frozen as its content."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, rank_lines, require_cluster, run_launch
from launchers import api, rankexec
from launchers.errors import LaunchError
from launchers.frozen import extcache, snapshot
from launchers.spec import RunSpec

NOBODY = 65534


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def spec_for(tree: Path) -> RunSpec:
    return RunSpec(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=(str(tree / "train.py"),),
        program_args=(),
        run_dir=str(tree / "runs/a"),
        name="a",
        snapshot=str(tree / "runs/.snapshots"),
    )


def plant(tree: Path, digest_dir: str, text: str) -> None:
    write(Path(digest_dir), {"train.py": text})


# ------------------------------------------------------------------ item 2: verified frozen code


def test_planted_snapshot_with_its_name_but_other_content_is_remade(tmp_path, monkeypatch):
    write(tmp_path, {"train.py": "print('MINE')\n", "lib/u.py": "U = 1\n"})
    monkeypatch.chdir(tmp_path)
    taken = snapshot.take(spec_for(tmp_path))
    plant(tmp_path, taken.snapshot_dir, "print('PLANTED')\n")  # the name of my tree, other content
    assert "does not hash to its name: made again at submit" in snapshot.dry_run_line(taken)
    snapshot.commit(snapshot.take(spec_for(tmp_path)))
    assert (Path(taken.snapshot_dir) / "train.py").read_text() == "print('MINE')\n"
    assert snapshot.verify(taken.snapshot_dir) is None
    extra = Path(taken.snapshot_dir) / "out.txt"  # a run wrote into it (root may)
    os.chmod(taken.snapshot_dir, 0o755)
    extra.write_text("x")
    assert "does not hash to its name" in snapshot.verify(taken.snapshot_dir)
    with pytest.raises(
        LaunchError,
        match=(
            r"the run's snapshot .* does not hash to its name: never run; accepted: "
            r"`launch resume --snapshot`"
        ),
    ):  # a resume keeping it
        snapshot.take(
            spec_for(tmp_path).replace(snapshot_dir=taken.snapshot_dir, snapshot_from=str(tmp_path))
        )
    snapshot.commit(snapshot.take(spec_for(tmp_path)))
    assert not extra.exists() and snapshot.verify(taken.snapshot_dir) is None
    os.chmod(taken.snapshot_dir, 0o755)  # an earlier version's runs wrote .pyc
    write(
        Path(taken.snapshot_dir),
        {"__pycache__/train.cpython-311.pyc": "", "lib/__pycache__/u.cpython-311.pyc": ""},
    )
    assert snapshot.verify(taken.snapshot_dir) is None
    write(Path(taken.snapshot_dir), {"__pycache__/evil.py": ""})
    assert "does not hash to its name" in snapshot.verify(taken.snapshot_dir)
    snapshot.commit(snapshot.take(spec_for(tmp_path)))
    assert os.stat(taken.snapshot_dir).st_mode & 0o777 == 0o555  # read-only once made


def test_snapshot_of_another_user_or_writable_by_others_is_refused_or_remade(tmp_path, monkeypatch):
    write(tmp_path, {"train.py": "print('MINE')\n"})
    monkeypatch.chdir(tmp_path)
    taken = snapshot.take(spec_for(tmp_path))
    snapshot.commit(taken)
    d = taken.snapshot_dir
    os.chmod(d, 0o777)  # mine, but anyone could have changed it
    assert "writable by others" in snapshot.verify(d)
    snapshot.commit(snapshot.take(spec_for(tmp_path)))
    assert snapshot.verify(d) is None
    for root, dirs, files in os.walk(d):  # the very same content, a stranger's
        for n in [root, *(os.path.join(root, f) for f in files)]:
            os.lchown(n, NOBODY, NOBODY)
    with pytest.raises(
        LaunchError, match=rf"snapshot {d} is owned by uid {NOBODY}, not you .*; accepted: "
    ) as e:
        snapshot.take(spec_for(tmp_path))
    assert "\n" not in str(e.value)
    with pytest.raises(LaunchError, match="owned by uid"):  # a resume keeping it: the same check
        snapshot.take(spec_for(tmp_path).replace(snapshot_dir=d, snapshot_from=str(tmp_path)))
    shutil.rmtree(d)
    os.symlink(str(tmp_path / "lib"), d)
    with pytest.raises(LaunchError, match="is a symlink"):
        snapshot.take(spec_for(tmp_path))


def test_extension_cache_checked_before_use(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path / "runs"))
    spec = extcache.settle(spec_for(tmp_path), {})
    extcache.make(spec)
    d = spec.torch_extensions_dir
    assert os.stat(d).st_mode & 0o022 == 0 and os.stat(d).st_uid == os.getuid()
    os.chmod(d, 0o777)
    with pytest.raises(
        LaunchError,
        match=rf"torch extension cache {d} is writable by others \(mode 777\); accepted: ",
    ):
        extcache.make(spec)
    os.chmod(d, 0o755)
    os.makedirs(os.path.join(d, "fused_op"))
    os.lchown(os.path.join(d, "fused_op"), NOBODY, NOBODY)
    with pytest.raises(LaunchError, match=rf"fused_op is owned by uid {NOBODY}, not you"):
        extcache.make(spec)


def test_work_dir_links_the_frozen_tree_and_keeps_the_programs_files(tmp_path):
    store, run = tmp_path / "runs/.snapshots", tmp_path / "runs/r"
    write(store / "a", {"t.py": "1", "data/x": "x", "ckpt/.keep": ""})
    write(store / "b", {"t.py": "2", "data/x": "y", "new.py": ""})
    run.mkdir()
    work = Path(rankexec.work_dir(str(run), str(store / "a")))
    assert (
        work == run / "work"
        and (work / "data/x").read_text() == "x"
        and not (work / "data").is_symlink()
    )
    (work / "ckpt/step1").write_text("mine")  # lands in the run, not in the store
    (work / "out.txt").write_text("mine")
    rankexec.work_dir(str(run), str(store / "b"))  # resume --snapshot: the new one
    assert (
        (work / "t.py").read_text() == "2"
        and (work / "data/x").read_text() == "y"
        and (work / "new.py").exists()
    )
    assert (work / "out.txt").read_text() == "mine" and (work / "ckpt/step1").read_text() == "mine"
    assert sorted(os.listdir(store / "a/ckpt")) == [".keep"]
    shutil.rmtree(work)
    os.symlink(str(tmp_path), work)
    with pytest.raises(LaunchError, match="'work' in the run dir .* is a symbolic link"):
        rankexec.work_dir(str(run), str(store / "a"))


def test_program_writes_land_in_its_run_and_the_store_stays_as_made(workdir):
    """Real (1x1): a planted snapshot is never run; the program reads its tree by relative paths,
    writes a file and a directory by relative paths: they land in <run dir>/work, the store still
    hashes to its name."""
    write(
        workdir,
        {
            "wprog.py": (
                "import os\nprint('READ', open('data/in.txt').read().strip(), "
                "os.getcwd(), flush=True)\nopen('out.txt', "
                "'w').write('o')\nos.makedirs('lightning_logs/v0', "
                "exist_ok=True)\nopen('data/new.txt', 'w').write('n')\n"
            ),
            "data/in.txt": "frozen\n",
        },
    )
    store = workdir / "runs/.snapshots"
    digest = snapshot.scan(str(workdir), exclude=(str(store), str(workdir / "runs/w"))).digest
    write(store / digest, {"wprog.py": "print('READ PLANTED', flush=True)\n"})
    run_launch("local", "--snapshot", "--run-dir", "runs/w", "--", "wprog.py", check=True)
    run = workdir / "runs/w"
    assert [ln.split()[1:] for ln in rank_lines(run, "READ")] == [["frozen", str(run / "work")]]
    assert (run / "work/out.txt").read_text() == "o" and (run / "work/lightning_logs/v0").is_dir()
    assert (run / "work/data/new.txt").read_text() == "n" and (
        run / "work/data/in.txt"
    ).is_symlink()
    assert snapshot.verify(str(store / digest)) is None
    assert (
        not (store / digest / "out.txt").exists()
        and not (store / digest / "lightning_logs").exists()
    )


# ------------------------------------------------------------------ item 6: the rules users expect


def test_secret_looking_files_left_out_unless_named_and_said(tmp_path, monkeypatch):
    write(
        tmp_path,
        {
            "train.py": "",
            ".env": "K=v\n",
            "id_rsa": "k",
            "keys/server.pem": "k",
            ".netrc": "m",
            ".aws/credentials": "c",
            "credentials.json": "{}",
            "keep/id_ed25519": "k",
            "envs.py": "",
        },
    )
    snap = snapshot.scan(str(tmp_path))
    assert snap.files == ("envs.py", "train.py")
    assert (".env", snapshot.SECRET) in snap.left_out and (
        "keys/server.pem",
        snapshot.SECRET,
    ) in snap.left_out
    (tmp_path / ".launchinclude").write_text(
        "# taken although they look like secrets\n.env\nkeep/\n"
    )
    assert snapshot.scan(str(tmp_path)).files == (
        ".env",
        ".launchinclude",
        "envs.py",
        "keep/id_ed25519",
        "train.py",
    )
    monkeypatch.chdir(tmp_path)
    line = snapshot.dry_run_line(snapshot.take(spec_for(tmp_path)))
    assert (
        "\n# snapshot: left out: .aws/credentials, .netrc, credentials.json, id_rsa, "
        "keys/server.pem (looks like a secret: name it in .launchinclude to take it)\n"
        in line
        and ".env" not in line.split("left out:")[1]
    )


def test_run_dirs_known_by_launchs_records_not_by_a_name(tmp_path, monkeypatch):
    record = (
        "run_id: x\nattempts: [{attempt: 0}]\nspec: {backend: local, program: [t.py], run_dir: "
        "/r, name: x, nodes: 1, gpus_per_node: 1}\n"
    )
    write(
        tmp_path,
        {
            "train.py": "",
            "configs/run.yaml": "lr: 0.1\n",
            "configs/run.yaml.tmp.999999999": "kept",
            f"lib/status.json.tmp.{os.getpid()}": "launch writing it now",
            "conf/run.yaml/x.yaml": "a: 1\n",
            "old/run.yaml": record,
            "old/status/rank0.json": "{}",
            "old/logs/a.log": "",
            "making/status/.lock": "",
            "notrun/run.yaml": record,
        },
    )
    os.makedirs(tmp_path / "status")
    snap = snapshot.scan(str(tmp_path))
    assert "configs/run.yaml" in snap.files and "conf/run.yaml/x.yaml" in snap.files  # Hydra's stay
    assert "configs/run.yaml.tmp.999999999" in snap.files  # not launch's temporary
    assert (f"lib/status.json.tmp.{os.getpid()}", "launch's temporary") in snap.left_out
    assert "notrun/run.yaml" in snap.files  # a record, no status/
    assert not any(f.startswith(("old/", "making/")) for f in snap.files)
    assert ("old/", "a run dir") in snap.left_out and ("making/", "a run dir") in snap.left_out


def test_dry_run_lists_everything_left_out(tmp_path, monkeypatch):
    write(
        tmp_path,
        {
            "train.py": "",
            "notes.tmp": "",
            ".launchignore": "*.tmp\n",
            "__pycache__/a.pyc": "",
            ".env": "K=v\n",
        },
    )
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    api.submit(
        RunSpec(
            backend="local",
            nodes=1,
            gpus_per_node=1,
            program=(str(tmp_path / "train.py"),),
            program_args=(),
            run_dir=str(tmp_path / "runs/d"),
            name="d",
            snapshot=str(tmp_path / "runs/.snapshots"),
        ),
        dry_run=True,
        out=out,
    )
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("# snapshot: left out:"))
    for part in (".env (looks like a secret", "notes.tmp (.launchignore)", "__pycache__/ (always)"):
        assert part in line


def test_symlinked_program_is_frozen_as_its_content(tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere/real.py"
    write(tmp_path, {"elsewhere/real.py": "print('ONE')\n", "tree/lib.py": ""})
    os.symlink(outside, tmp_path / "tree/train.py")
    os.symlink("lib.py", tmp_path / "tree/alias.py")  # inside the tree: stays a link
    os.symlink(tmp_path / "elsewhere", tmp_path / "tree/ext")  # a directory out of it: a link, said
    monkeypatch.chdir(tmp_path / "tree")
    taken = snapshot.take(spec_for(tmp_path / "tree"))
    snapshot.commit(taken)
    outside.write_text("print('EDITED')\n")
    frozen = Path(taken.snapshot_dir) / "train.py"
    assert not frozen.is_symlink() and frozen.read_text() == "print('ONE')\n"
    assert os.readlink(Path(taken.snapshot_dir) / "alias.py") == "lib.py"
    assert (
        "ext (a link out of the tree, kept as a link: what it points to is not frozen)"
        in snapshot.dry_run_line(taken)
    )
    assert snapshot.verify(taken.snapshot_dir) is None


@pytest.mark.slurm
def test_on_slurm_a_programs_relative_write_lands_in_its_run(workdir):
    """The issue's case (accelerate's test_script on Slurm wrote check_main_process_first.txt into
    the store): 1 node x 1 rank, the snapshot on by default there."""
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")
    write(
        workdir,
        {
            "wprog.py": (
                "import os\nopen('check_main_process_first.txt', 'w').write('x')\n"
                "print('CWD', os.getcwd(), flush=True)\n"
            )
        },
    )
    run_launch(
        "slurm",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--run-dir",
        "runs/s",
        "--",
        "wprog.py",
        check=True,
    )
    run_launch("wait", "runs/s", timeout=240, check=True)
    run = workdir / "runs/s"
    sdir = json.loads(run_launch("status", str(run), "--json").stdout)["snapshot"]
    assert [ln.split()[1] for ln in rank_lines(run, "CWD")] == [str(run / "work")]
    assert (run / "work/check_main_process_first.txt").read_text() == "x"
    assert (
        not os.path.exists(os.path.join(sdir, "check_main_process_first.txt"))
        and snapshot.verify(sdir) is None
    )


def test_in_a_git_tree_too_secrets_out_and_what_git_ignores_said(tmp_path):
    write(
        tmp_path,
        {
            "train.py": "",
            ".env": "K=v\n",
            ".gitignore": "*.log\ndata/\n",
            "x.log": "",
            "data/big.bin": "",
            "deploy/id_ed25519": "k",
        },
    )
    for args in (
        ("init", "-q"),
        ("add", "train.py", ".env", ".gitignore"),
        ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"),
    ):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    snap = snapshot.scan(str(tmp_path))
    assert snap.files == (".gitignore", "train.py")  # tracked or not: a secret's name is enough
    assert {
        (".env", snapshot.SECRET),
        ("deploy/id_ed25519", snapshot.SECRET),
        ("x.log", ".gitignore"),
        ("data/", ".gitignore"),
    } <= set(snap.left_out)
    (tmp_path / ".launchinclude").write_text(".env\n")
    assert ".env" in snapshot.scan(str(tmp_path)).files
