"""Shared test helpers: run the real `launch` CLI as a subprocess, in a scratch cwd."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import clusterturn

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LAUNCH = str(BIN / "launch")
DATA = Path(__file__).resolve().parent / "data"
# the runs index (launchers.records.runindex) of the runs the tests start: a scratch state dir, not
# ~/.local/state
os.environ.setdefault("LAUNCH_STATE_DIR", tempfile.mkdtemp(prefix="launch-test-state-"))
# no warm launcher (launchers.warmstart) outlives a test: on only where a test turns it on
# (tests/test_warmstart.py)
os.environ.setdefault("LAUNCH_WARM", "0")
# what `launch doctor` learns of the nodes (launchers.diagnosis.nodefacts): a scratch cache, not
# ~/.cache/launchers/nodes
os.environ.setdefault("LAUNCH_NODE_FACTS_DIR", tempfile.mkdtemp(prefix="launch-test-nodes-"))


def run_launch(
    *args: str,
    cwd: str | os.PathLike | None = None,
    timeout: float = 300,
    env: dict | None = None,
    check: bool | None = None,
) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    p = subprocess.run(
        [LAUNCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e
    )
    if check and p.returncode != 0:
        raise AssertionError(
            f"launch {' '.join(args)} exited "
            f"{p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        )
    return p


def read_json(path: str | os.PathLike) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def rank_lines(run_dir: str | os.PathLike, marker: str) -> list[str]:
    """Lines starting with `marker` from every rank log of a run."""
    out = []
    for log in sorted(Path(run_dir, "logs").glob("node*/rank*.log")):
        out += [ln for ln in log.read_text().splitlines() if ln.startswith(marker)]
    return out


def assert_ranks_refused(run_dir: str | os.PathLike, marker: str, needle: str, world: int) -> None:
    """Bad input: every rank decides the same before any process group exists and exits 2; the agent
    ends the others as soon as the first one is out (fail-fast), so a rank still starting may be
    stopped (SIGTERM) before it prints. No rank may succeed or fail otherwise; at least one says
    why, all in the same words."""
    lines = rank_lines(run_dir, marker)
    assert lines and all(needle in ln for ln in lines), lines
    ends = [read_json(Path(run_dir, "status", f"rank{r}.json")) for r in range(world)]
    assert any(e["exit_code"] == 2 for e in ends), ends
    assert all(
        e["exit_code"] == 2 or (e["exit_code"] is None and e["signal"] in ("SIGTERM", "SIGKILL"))
        for e in ends
    ), ends


def require_cluster(what: str, ok: bool, how: str) -> None:
    """A test that needs a cluster fails (never skips) when the cluster is not up."""
    if not ok:
        pytest.fail(f"{what} is not up: run `{how}` first (make test does it)", pytrace=False)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A scratch cwd holding the tests' helper programs; runs go under ./runs."""
    for f in DATA.glob("*.py"):
        (tmp_path / f.name).write_text(f.read_text())
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -------------------------------------------------------------- groups (make test GROUP=..., xdist)
# A test that needs a dev cluster belongs to that cluster's group (make test GROUP=slurm). The
# groups wait on different things (Slurm's scheduler, the SSH hosts, this machine's CPUs), so they
# run side by side (`make test`: -n N --dist loadgroup), a module at a time per worker (its module
# fixtures run once there). Several workers may use one cluster at once; a test marked `exclusive`
# (it kills, pauses or cuts a part of its cluster, or reads the cluster-wide state) runs while no
# other test of its cluster does (tests/clusterturn.py), and a cluster's exclusive tests run one
# after another on one worker, first. xdist's own xdist_group marks rename node ids, which pytest
# 9's node ids no longer allow; so the workers write each test's scope to a file and our scheduler
# reads it.
GROUPS = ("slurm", "ssh", "local")
# Local modules that take minutes go first, longest first, so the other workers are not left waiting
# on one at the end; the first ones (no module fixture, or one made once: conftest.once) are split,
# one scope per test. test_wheel_install: 1-3 min, +2-5 min the first time on a machine (its 5.6 GB
# torch venv, then cached).
SLOW_LOCAL = (
    "tests/faults/test_faults_local.py",
    "tests/test_frameworks.py",
    "tests/test_e2e_convnet.py",
    "tests/test_workload_deepspeed_reshard.py",
    "tests/test_wheel_install.py",
    "tests/test_workload_convnet.py",
    "tests/test_workload_deepspeed.py",
    "tests/test_workload_fsdp.py",
    "tests/test_hang.py",
    "tests/test_recovery.py",
    "tests/test_recovery_local.py",
    "tests/test_container_podman.py",
    "tests/test_ckpt_verify.py",
)
SPLIT_LOCAL = SLOW_LOCAL[:4]


def group_of(keywords) -> str:
    if "slurm" in keywords:
        return "slurm"
    return "ssh" if "ssh" in keywords else "local"


def pytest_addoption(parser):
    parser.addoption(
        "--group",
        action="append",
        choices=GROUPS,
        default=[],
        help="run only this group's tests (repeatable): slurm, ssh or local",
    )


def scope_of(item) -> str:
    """The scheduler's unit: a cluster's exclusive tests together ("slurm!"), else the group and the
    module (a long local module's test alone: SPLIT_LOCAL)."""
    g, path = group_of(item.keywords), item.nodeid.split("::")[0]
    if g != "local" and "exclusive" in item.keywords:
        return f"{g}!"
    if g == "local":
        return item.nodeid if path in SPLIT_LOCAL else path
    return f"{g}:{path}"


def _order(item) -> tuple:
    g = group_of(item.keywords)
    path = item.nodeid.split("::")[0]
    slow = SLOW_LOCAL.index(path) if path in SLOW_LOCAL else len(SLOW_LOCAL)
    if g != "local":  # the exclusive lanes first (they wait longest), then the cluster modules
        return (0 if "exclusive" in item.keywords else 1, GROUPS.index(g))
    return (2, slow)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "slurm" in item.keywords and "ssh" in item.keywords:
            raise pytest.UsageError(
                f"{item.nodeid}: marked both slurm and ssh (one cluster group per test)"
            )
    wanted = config.getoption("--group")
    if wanted:
        config.hook.pytest_deselected(
            items=[i for i in items if group_of(i.keywords) not in wanted]
        )
        items[:] = [i for i in items if group_of(i.keywords) in wanted]
    items.sort(key=_order)  # stable: the cluster groups, then slow local modules, then the rest
    where = getattr(config, "workerinput", {}).get("launch_test_groups")
    if where:  # an xdist worker: tell the controller's scheduler each test's group
        scopes = {i.nodeid: scope_of(i) for i in items}
        tmp = f"{where}.{config.workerinput['workerid']}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(scopes, f)
        os.replace(tmp, where)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["launch_test_groups"] = node.config._launch_test_groups


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False
    return clusterturn.scheduler(config, log, config._launch_test_groups)


def run_shared_dir(config) -> str:
    """The directory every worker of this pytest run shares (the cluster locks, once()'s results);
    the controller removes it at the end."""
    return os.path.dirname(
        getattr(config, "workerinput", {}).get("launch_test_groups") or config._launch_test_groups
    )


def once(request, key: str, make):
    """clusterturn.once in this run's shared directory: e.g. a reference run that modules on several
    workers need."""
    return clusterturn.once(run_shared_dir(request.config), key, make)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The teardown report carries the CPU seconds of the processes the test started and waited for
    (its local runs' agents and ranks; the work of the cluster nodes is their daemons' children, not
    counted): the suite is CPU-bound on 2 cores, so this, not the wall time, says what a test costs
    (GroupClock prints it by module)."""
    outcome = yield
    if call.when == "teardown" and hasattr(item, "_launch_cpu0"):
        outcome.get_result().user_properties.append(
            ("children_cpu_s", _children_cpu() - item._launch_cpu0)
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A cluster test takes its turn on its cluster (shared, or alone when exclusive) around its
    whole protocol: the module fixtures it sets up or tears down use the cluster too."""
    item._launch_cpu0 = _children_cpu()
    g = group_of(item.keywords)
    if g == "local":
        yield
        return
    with clusterturn.turn(run_shared_dir(item.config), g, "exclusive" in item.keywords):
        yield


class GroupClock:
    """Each group's wall time (its first test's start to its last test's end) and test count, from
    the test reports (in an xdist run they reach the controller with their workers' clocks, which
    are this machine's)."""

    def __init__(self):
        self.span: dict[str, list[float]] = {}
        self.tests: dict[str, set] = {}
        self.cpu: dict[str, float] = {}  # module -> CPU seconds of its tests' child processes

    def pytest_runtest_logreport(self, report):
        for k, v in report.user_properties:
            if k == "children_cpu_s":
                mod = report.nodeid.split("::")[0]
                self.cpu[mod] = self.cpu.get(mod, 0.0) + v
        if not report.start:
            return
        g = group_of(report.keywords)
        s = self.span.setdefault(g, [report.start, report.stop])
        s[0], s[1] = min(s[0], report.start), max(s[1], report.stop)
        self.tests.setdefault(g, set()).add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.span:
            return
        tr = terminalreporter
        tr.section("group wall times")
        for g in sorted(self.span, key=lambda k: self.span[k][0]):
            a, b = self.span[g]
            tr.write_line(f"{g:<6} {b - a:7.1f} s  ({len(self.tests[g])} tests)")
        first = min(s[0] for s in self.span.values())
        last = max(s[1] for s in self.span.values())
        tr.write_line(f"{'all':<6} {last - first:7.1f} s  (first test's start to last test's end)")
        if self.cpu:
            tr.section("CPU of the tests' own processes, by module (15 costliest)")
            for mod, cpu in sorted(self.cpu.items(), key=lambda kv: -kv[1])[:15]:
                tr.write_line(f"{cpu:7.1f} CPU-s  {mod}")
            tr.write_line(
                f"{sum(self.cpu.values()):7.1f} CPU-s  all modules (the cluster nodes' work not "
                "counted)"
            )


def pytest_configure(config):
    # the controller (or a run without xdist) prints the summary
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(GroupClock(), "group-clock")
        config._launch_test_groups = os.path.join(
            tempfile.mkdtemp(prefix="launch-test-groups-"), "groups.json"
        )


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and hasattr(config, "_launch_test_groups"):
        shutil.rmtree(os.path.dirname(config._launch_test_groups), ignore_errors=True)
