"""The snapshot's stat cache (launchers.frozen.statcache, issue 38 item 1): an unchanged tree is
found by its stat keys and read no more, with the digest a full hash gives; an edit is seen even
with size and mtime put back (ctime moves); a cache others could write, or not of the exact shape,
is ignored; a wrong hash in the user's own cache leads at worst to a refused launch (the cache
dropped) or a snapshot made again -- never to a snapshot whose content differs from its name. Pure:
temp trees, no launch."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from launchers import api
from launchers.errors import LaunchError
from launchers.frozen import extcache, snapshot, statcache
from launchers.spec import RunSpec

NOBODY = 65534
FILES = {"train.py": "print('MINE')\n", "lib/u.py": "U = 1\n", "data/d.bin": "d" * 3000}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(statcache, "RACY_NS", 0)  # the files are seconds old at most here
    for rel, text in FILES.items():
        (tmp_path / "t" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "t" / rel).write_text(text)
    monkeypatch.chdir(tmp_path / "t")
    return tmp_path / "t"


def full(root: Path) -> str:
    """The digest with every file read (no cache)."""
    statcache.ENABLED = False
    try:
        return snapshot.scan(str(root)).digest
    finally:
        statcache.ENABLED = True


def cached(root: Path) -> snapshot.Snapshot:
    snap = snapshot.scan(str(root))
    statcache.flush()
    return snap


def spec_for(tree: Path) -> RunSpec:
    return RunSpec(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=(str(tree / "train.py"),),
        program_args=(),
        run_dir=str(tree.parent / "runs/a"),
        name="a",
        snapshot=str(tree.parent / "runs/.snapshots"),
    )


def test_unchanged_files_are_not_read_again_and_an_edit_with_mtime_put_back_is_seen(tree):
    first = cached(tree)
    assert first.read == 3 and first.digest == full(tree)
    again = cached(tree)
    assert again.read == 0 and again.digest == first.digest
    st = os.stat(tree / "lib/u.py")
    time.sleep(0.05)  # past the clock tick of the cached ctime
    (tree / "lib/u.py").write_text("U = 2\n")  # same size, mtime put back: ctime moved
    os.utime(tree / "lib/u.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = cached(tree)
    assert edited.read == 1 and edited.digest != first.digest and edited.digest == full(tree)
    os.chmod(tree / "train.py", 0o755)  # the kind (executable) is in the key: the mode
    assert cached(tree).digest == full(tree) != edited.digest


def test_a_file_changed_within_the_racy_window_is_not_remembered(tree, monkeypatch):
    monkeypatch.setattr(statcache, "RACY_NS", 10**12)
    assert cached(tree).read == 3 and cached(tree).read == 3


@pytest.mark.parametrize(
    "spoil",
    [
        "others may write",
        "not mine",
        "a symlink",
        "not JSON",
        "another shape",
        "another root",
        "too big",
    ],
)
def test_a_cache_not_safely_mine_or_not_of_the_exact_shape_is_ignored(tree, monkeypatch, spoil):
    cached(tree)
    path = statcache.path_for(str(tree))
    data = json.loads(Path(path).read_text())
    data["entries"]["train.py"][6] = "0" * 64  # a forged hash: would name other content
    Path(path).write_text(json.dumps(data))
    if spoil == "others may write":
        os.chmod(path, 0o666)
    elif spoil == "not mine":
        os.lchown(path, NOBODY, NOBODY)
    elif spoil == "a symlink":
        os.rename(path, path + ".real")
        os.symlink(path + ".real", path)
    elif spoil == "not JSON":
        Path(path).write_text("{")
    elif spoil == "another shape":
        Path(path).write_text(json.dumps({**data, "extra": 1}))
    elif spoil == "another root":
        Path(path).write_text(json.dumps({**data, "root": "/elsewhere"}))
    else:
        monkeypatch.setattr(statcache, "MAX_BYTES", 100)
    snap = cached(tree)
    assert snap.read == 3 and snap.digest == full(tree)
    assert (
        not os.path.islink(path)
        and os.stat(path).st_uid == os.getuid()
        and os.stat(path).st_mode & 0o777 == 0o600
    )


def test_a_wrong_hash_in_my_own_cache_is_refused_or_made_again_never_run(tree):
    """The user's own cache (0600, theirs) with a wrong hash for an unchanged file: the launch
    naming that digest is refused when the copy hashes otherwise, and the cache dropped; a wrong
    hash for a snapshot dir's file makes verify() fail: the snapshot is made again."""
    cached(tree)
    path = statcache.path_for(str(tree))
    data = json.loads(Path(path).read_text())
    data["entries"]["train.py"][6] = "0" * 64
    Path(path).write_text(json.dumps(data))
    taken = snapshot.take(spec_for(tree))
    assert os.path.basename(taken.snapshot_dir) != full(tree)
    with pytest.raises(LaunchError, match="changed while its snapshot was taken"):
        snapshot.commit(taken)
    assert not os.path.exists(path)
    taken = snapshot.take(spec_for(tree))
    snapshot.commit(taken)
    d = taken.snapshot_dir
    assert os.path.basename(d) == full(tree) and snapshot.verify(d) is None and os.path.exists(path)
    # made by this launch: known as written
    ddata = json.loads(Path(statcache.path_for(d)).read_text())
    assert sorted(ddata["entries"]) == sorted(FILES)
    ddata["entries"]["lib/u.py"][6] = "0" * 64
    Path(statcache.path_for(d)).write_text(json.dumps(ddata))
    assert snapshot.verify(d) == "does not hash to its name"
    ino = os.stat(Path(d) / "train.py").st_ino
    snapshot.commit(snapshot.take(spec_for(tree)))
    assert snapshot.verify(d) is None and os.stat(Path(d) / "train.py").st_ino != ino  # made again
    assert (Path(d) / "lib/u.py").read_text() == FILES["lib/u.py"]


def test_a_second_launch_reads_and_copies_nothing_and_the_dry_run_writes_no_cache(tree):
    out = io.StringIO()
    api.submit(spec_for(tree), dry_run=True, out=out)
    assert (
        "# snapshot: 3 files, 2.9 KiB; largest: data/ 2.9 KiB, train.py 14 B, lib/ 6 B\n"
        in out.getvalue()
    )
    assert not os.path.exists(statcache.cache_dir())
    taken = snapshot.take(spec_for(tree))
    snapshot.commit(taken)
    ino = os.stat(Path(taken.snapshot_dir) / "train.py").st_ino
    again = snapshot.take(spec_for(tree))
    cache = statcache.hashes(again.snapshot_dir)
    before = cache.read
    snapshot.commit(again)
    assert (
        again.snapshot_dir == taken.snapshot_dir and cached(tree).read == 0 and cache.read == before
    )
    assert os.stat(Path(taken.snapshot_dir) / "train.py").st_ino == ino  # no copy
    snap = snapshot.scan(str(tree))
    os.unlink(tree / "data/d.bin")  # the dry-run's sizes are scan()'s: nothing looked up
    assert (
        snapshot.held(snap) == "3 files, 2.9 KiB; largest: data/ 2.9 KiB, train.py 14 B, lib/ 6 B"
    )


def test_the_extension_cache_key_is_read_once_per_environment(tree, monkeypatch):
    """torch's version and CUDA (importlib.metadata: 15-30 ms a launch) are remembered while no
    sys.path directory (where pip installs) changed; a remembered answer others could have written
    is not used."""
    site = tree.parent / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    real, calls = extcache.version, []
    monkeypatch.setattr(extcache, "version", lambda name: calls.append(name) or real(name))
    want = extcache.key(sys.executable)
    # saved by make(), never a dry-run
    assert calls == ["torch"] and not os.path.exists(statcache.cache_dir())
    extcache.make(spec_for(tree))
    assert extcache.key(sys.executable) == want and calls == ["torch"]
    time.sleep(0.05)
    (site / "torch-0.0.dist-info").mkdir()  # another torch installed first on sys.path
    now = extcache.key(sys.executable)
    assert now != want and calls == ["torch", "torch"]
    extcache.make(spec_for(tree))
    path = next(p for p in Path(statcache.cache_dir()).iterdir())
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "torch": ["9.9", "99.9"]}))
    os.chmod(path, 0o666)
    assert extcache.key(sys.executable) == now and len(calls) == 3
