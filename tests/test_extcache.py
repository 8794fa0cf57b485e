"""What a job builds once, it keeps (issue 22 item 5): torch's JIT extensions in one directory per
environment under the runs root (launchers.frozen.extcache), and a node that builds one says so."""

import io
import os
import sys

from conftest import run_launch
from launchers import api, layout
from launchers.containers import container
from launchers.diagnosis import explain
from launchers.frozen import extcache, snapshot
from launchers.hang.watch import Coordinator
from launchers.records.rundir import RunDir
from launchers.spec import RunSpec
from launchers.torchrun import node_command


def spec_in(root, **kw):
    return RunSpec("local", 1, 2, ("t.py",), (), os.path.join(root, "job-1"), "job", **kw)


def test_key_and_env_user_wins_container_changes_key(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path))
    spec = extcache.settle(spec_in(str(tmp_path)), environ={})
    want = os.path.join(str(tmp_path), ".torch_extensions", extcache.key(sys.executable))
    assert spec.torch_extensions_dir == want and len(os.path.basename(want)) == 16
    env = node_command(
        spec, node_rank=0, master_addr="h", master_port=1, run_id="r", attempt=0
    ).env_dict
    assert env["TORCH_EXTENSIONS_DIR"] == env["LAUNCH_TORCH_EXTENSIONS_DIR"] == want
    assert "made at submit" in extcache.dry_run_line(spec, {})
    for user in (
        spec_in(str(tmp_path), env=(("TORCH_EXTENSIONS_DIR", "/mine"),)),
        spec_in(str(tmp_path)),
    ):
        theirs = extcache.settle(user, environ={"TORCH_EXTENSIONS_DIR": "/mine"})
        assert theirs.torch_extensions_dir == ""
        assert "/mine (yours" in extcache.dry_run_line(theirs, {"TORCH_EXTENSIONS_DIR": "/mine"})
        env = node_command(
            theirs, node_rank=0, master_addr="h", master_port=1, run_id="r", attempt=0
        ).env_dict
        assert "LAUNCH_TORCH_EXTENSIONS_DIR" not in env and env.get("TORCH_EXTENSIONS_DIR") in (
            None,
            "/mine",
        )
    keys = {
        extcache.key(sys.executable),
        extcache.key(sys.executable, "img:1"),
        extcache.key(sys.executable, "img:2"),
        extcache.key(sys.executable, "img@sha256:" + "a" * 64),
        extcache.key("/other/python"),
    }
    assert len(keys) == 5 and extcache.key(sys.executable, "img:1") == extcache.key("/x", "img:1")
    boxed = extcache.settle(
        spec_in(
            str(tmp_path),
            container_image="img:1",
            container_runtime="podman",
            container_python="python3",
            container_workdir=str(tmp_path),
        ),
        environ={},
    )
    assert boxed.torch_extensions_dir != want
    assert (boxed.torch_extensions_dir,) * 2 + (False,) in container.mounts(boxed)
    os.makedirs(os.path.join(want, "op"))
    for f in (os.path.join(want, "op", "op.so"), str(tmp_path / "t.py")):
        open(f, "w").close()
    assert snapshot.tree_files(str(tmp_path)) == ["t.py"]  # built ops never go into a snapshot


def test_a_held_filebaton_is_said_building_and_is_no_hang(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path))
    spec = extcache.settle(spec_in(str(tmp_path), hang_timeout=1.0), environ={})
    rd = RunDir.create(spec, "job-1234", {})
    extcache.make(spec)
    assert api.format_status(dict(api.status(rd.path), state="RUNNING")).count("building") == 0
    os.makedirs(os.path.join(spec.torch_extensions_dir, "deepspeed_shm_comm"))
    # here, not at collection: every xdist worker collects
    from torch.utils.file_baton import FileBaton

    baton = FileBaton(os.path.join(spec.torch_extensions_dir, "deepspeed_shm_comm", "lock"))
    assert baton.try_acquire()  # torch's own lock, as cpp_extension._jit_compile takes it
    try:
        data = rd.read_run_yaml()["spec"]
        start = os.stat(baton.lock_file_path).st_mtime
        found = explain.building(rd, data, 0, now=start + 42)
        assert found == [{"node": 0, "name": "deepspeed_shm_comm", "secs": 42.0}]
        said = "node 0: building a torch extension (deepspeed_shm_comm, 42s)"
        assert extcache.line(0, "deepspeed_shm_comm", 42) == said
        out = io.StringIO()
        tell = extcache.Teller(spec, 0, out)  # the launcher's own lines: once, again after EVERY_S
        for t in (42, 43, 44.5, 58):
            tell(start + t)
        assert out.getvalue().splitlines() == [
            "launch: " + said,
            "launch: " + said.replace("42s", "58s"),
        ]
        coord = Coordinator(rd, 0, 1.0, 1, 2)
        # both ranks seen by the node's monitor, none advanced since the start
        layout.atomic_write(
            layout.path(rd.path, "node_progress", node=0),
            '{"attempt": 0, "ranks": {'
            '"0": {"last_advance": %f, "step": null}, "1": {"last_advance": %f, "step": null}}}'
            % (start, start),
        )
        assert coord.check(start + 100) is None and coord.requested is None
        assert "a lock left by a killed build?" in extcache.line(0, "x", extcache.STALE_S)
        coord.check(start + extcache.STALE_S + 100)
        # a lock that old may be stale: no longer counted as a build
        assert coord.requested is not None
        coord = Coordinator(rd, 0, 1.0, 1, 2)
        assert coord.check(start + 100) is None and coord.requested is None
    finally:
        baton.release()
    assert extcache.building(spec.torch_extensions_dir) == []
    # its last build just ended
    assert coord.check(start + 100.5) is None and coord.requested is None
    coord.check(start + 102)
    assert coord.requested is not None  # then a quiet run is a hang again


PROBE = """import os, sys
d = os.environ["TORCH_EXTENSIONS_DIR"]
assert os.path.isdir(d) and os.path.dirname(d) == os.path.join(sys.argv[1], ".torch_extensions"), d
print("EXT=" + d, flush=True)
"""


def test_both_ranks_and_a_second_run_share_one_extension_dir(workdir):
    (workdir / "ext_probe.py").write_text(PROBE)
    root, env = str(workdir / "runs"), {"LAUNCH_RUNS_ROOT": str(workdir / "runs")}
    run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/a",
        "--",
        "ext_probe.py",
        root,
        check=True,
        timeout=180,
        env=env,
    )
    seen = set()
    for rank in (0, 1):
        log = (workdir / "runs" / "a" / "logs" / "node0" / f"rank{rank}.log").read_text()
        seen |= {ln.split("EXT=", 1)[1] for ln in log.splitlines() if "EXT=" in ln}
    assert len(seen) == 1 and (d := seen.pop()).startswith(
        os.path.join(root, ".torch_extensions") + os.sep
    )
    assert (
        "torch ext dir:   " + d in run_launch("status", "runs/a", "--manifest", check=True).stdout
    )
    plan = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--dry-run",
        "--",
        "ext_probe.py",
        root,
        check=True,
        env=env,
    ).stdout  # the next run: the same directory, reused
    assert f"# torch extensions: {d} (shared by every node and run; exists: reused)" in plan
    assert f"TORCH_EXTENSIONS_DIR={d}" in plan
