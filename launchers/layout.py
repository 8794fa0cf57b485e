"""Where everything lives in a run directory: the one place its paths are spelled (FILES below).

Stdlib only and free of side effects except the two small atomic writers at the end: every side uses
it -- the launcher, each rank's wrapper (launchers.rankexec), an SSH host's agent (launchers.remote)
and a Slurm node (launchers.backends.slurm.node) -- so none of them spells a path of its own. Who
writes what: RunDir (launchers.records.rundir) writes run.yaml, status.json and the records; the job
writes its logs (through the rank wrapper and the agents), checkpoints, metrics.jsonl and
final.json; the launcher never overwrites anything the job wrote. Nothing the launcher writes goes
through a symbolic link below the run dir: every writer takes its path from own_path()/no_symlink()
(an lstat of each component below the run dir's root); what launch reads of a run dir others may
write is checked by launchers.records.rundircheck.
"""

from __future__ import annotations

import errno
import os
import time

TYPE_CHECKING = False  # typing itself costs every rank's wrapper ~5 ms at its start
if TYPE_CHECKING:
    from typing import Any

from .errors import LaunchError, brief

RUN_YAML = "run.yaml"
STATUS = "status.json"


# ------------------------------------------------------------------------------- choosing a run dir


def runs_root(root: str | None = None) -> str:
    return os.path.abspath(root or os.environ.get("LAUNCH_RUNS_ROOT") or "runs")


def choose_run_dir(
    run_dir: str | None, name: str, root: str | None = None, existing: bool = False
) -> str:
    """--run-dir as given (absolute), else <runs root>/<name>-<time>-<random>; never an existing
    path, unless `existing` (a run Slurm requeued inside the user's allocation:
    launchers.backends.slurm.inalloc); never '' nor a path inside another run dir (its checkpoints/,
    logs/: that run's files)."""
    if run_dir is not None and not run_dir.strip():
        raise LaunchError(
            f"--run-dir {run_dir!r} is empty; give a directory path, or leave --run-dir out "
            "(<runs root>/<name>-<time>)"
        )
    if run_dir:
        path = os.path.abspath(run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = os.path.join(runs_root(root), f"{name}-{stamp}-{os.urandom(2).hex()}")
    if existing and run_dir and is_run_dir(path):
        return path
    if os.path.lexists(path):
        raise LaunchError(
            f"run dir {path!r} already exists; use `launch resume {path}` or another --run-dir"
        )
    # here: every rank's wrapper imports this module on its way to the program
    from pathlib import PurePath

    outer = next((str(p) for p in PurePath(path).parents if is_run_dir(str(p))), None)
    if outer is not None:
        raise LaunchError(
            f"run dir {path!r} is inside the run dir {outer!r} (its files); give a --run-dir "
            "outside any run dir"
        )
    check_creatable(path)
    return path


def check_creatable(path: str) -> None:
    """A run dir can be made at `path`: names within the file system's limits, the nearest existing
    parent a directory you may write on a writable file system. Raises LaunchError naming the path
    and what is accepted."""
    accepted = "give --run-dir (or $LAUNCH_RUNS_ROOT) in a directory you can write"
    bad = next((c for c in path if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:  # a newline would end an #SBATCH line of the script and start a command
        raise LaunchError(
            f"run dir {brief(path)} contains the control character {bad!r}; accepted: a path "
            "without control characters (newline, tab, ...)"
        )
    parent = path
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    limit = os.pathconf(parent, "PC_NAME_MAX") if os.path.isdir(parent) else 255
    longest = max(len(os.fsencode(c)) for c in path.split(os.sep))
    if longest > limit or len(os.fsencode(path)) >= 4096:
        raise LaunchError(
            f"run dir {brief(path)} is too long ({longest} bytes in one name, {len(path)} in all); "
            f"accepted: names of at most {limit} bytes, paths under 4096"
        )
    if path != parent and not os.path.isdir(parent):
        raise LaunchError(
            f"run dir {brief(path)} cannot be created: {brief(parent)} is not a directory; "
            f"{accepted}"
        )
    if os.statvfs(parent).f_flag & os.ST_RDONLY:
        raise LaunchError(
            f"run dir {brief(path)} cannot be created: {brief(parent)} is on a read-only file "
            f"system; {accepted}"
        )
    if path != parent and not os.access(parent, os.W_OK | os.X_OK):
        raise LaunchError(
            f"run dir {brief(path)} cannot be created: {brief(parent)} is not writable by you; "
            f"{accepted}"
        )


def is_run_dir(run_dir: str) -> bool:
    return os.path.isfile(os.path.join(run_dir, RUN_YAML))


def record_problem(data: object) -> str | None:
    """Why a loaded run.yaml (or the exception reading it) is not a launcher's record; None when it
    is one."""
    if isinstance(data, BaseException):
        return (
            "cannot be read "
            f"({brief(str(data).splitlines()[0] if str(data) else type(data).__name__)})"
        )
    if not isinstance(data, dict):
        return f"is not a mapping (got {type(data).__name__})"
    # here: the rank wrapper imports this module, not the option table
    from .runopts import BACKENDS

    spec = data.get("spec")
    if (
        not isinstance(data.get("run_id"), str)
        or not isinstance(data.get("attempts"), list)
        or not data["attempts"]
    ):
        return "lacks run_id or attempts"
    if not all(isinstance(a, dict) for a in data["attempts"]):
        return "has attempts that are not mappings"
    if (
        not isinstance(spec, dict)
        or spec.get("backend") not in BACKENDS
        or not isinstance(spec.get("program"), list)
        or not all(isinstance(spec.get(k), str) for k in ("run_dir", "name"))
    ):
        return "has no spec with a backend, a program, a run_dir and a name"
    if not all(
        isinstance(spec.get(k), int) and not isinstance(spec.get(k), bool)
        for k in ("nodes", "gpus_per_node")
    ):
        return "has a spec without integer nodes and gpus_per_node"
    return None


# ------------------------------------------------------------------------------------------ paths

FILES = {  # what -> path inside the run dir ({fields} filled in by path())
    "run_yaml": RUN_YAML,  # resolved spec, per-node commands, versions, attempts
    "status": STATUS,  # state, attempt, per-node exit codes, first failure
    # per node slot: failures, strikes, quarantine (launchers.ledgers.nodeledger)
    "node_ledger": "nodes.json",
    # a detached launcher's own output (the Python API: launchers.detach)
    "launcher_log": "launcher.log",
    # what ran: the launcher's part at submit, rank 0's (launchers.records.manifest)
    "manifest": "manifest.json",
    # rank 0's installed packages, `name==version` sorted (its sha256 there)
    "packages": "packages.txt",
    "records": "status",  # the per-rank and per-node exit records
    "lock": "status/.lock",  # held by every writer of status.json and the records
    "rank_record": "status/rank{rank}.json",
    "node_record": "status/node{node}.json",
    # --dist-backend auto: a node's GPUs, its answer
    "node_backend": "status/backend-a{attempt}-node{node}.json",
    # --warm-spares: the slot's zygote is up (nodeside.zygote)
    "warm_slot": "status/warm-slot{slot}.json",
    # the attempt the run is at: older writers are fenced (launchers.records.fence)
    "generation": "status/generation",
    "logs": "logs",
    "node_logs": "logs/node{node}",
    "rank_log": "logs/node{node}/rank{rank}.log",
    "agent_log": "logs/node{node}/agent.log",
    "checkpoints": "checkpoints",  # step-<N>/ and `latest` (launchers.ckptptr), written by the job
    "metrics": "metrics.jsonl",  # written by the job (rank 0)
    "work": "work",  # --snapshot: the program's cwd, links to the frozen tree (rankexec)
    "progress": "progress/rank{rank}.json",  # the program's heartbeat (launchers.heartbeat)
    "node_progress": "progress/node{node}.json",  # a node's view of its ranks (launchers.hang)
    "nccl": "nccl",  # NCCL's and PyTorch's dumps (--dist-backend nccl)
    "nccl_flight": "nccl/flight_rank_",  # the flight recorder's dump, per rank (+ rank number)
    "hang": "hang/attempt{attempt}",  # stacks and verdict of a detected hang
    "hang_request": "hang/attempt{attempt}/request.json",
    "hang_node": "hang/attempt{attempt}/node{node}.json",
    "hang_stack": "hang/attempt{attempt}/rank{rank}.txt",
    "hang_verdict": "hang/attempt{attempt}/verdict.json",
    # this attempt's stop is a hang's (launchers.heartbeat.hang_stop)
    "hang_stop": "hang/attempt{attempt}/stop.json",
    "slurm": "slurm",  # submitit's folder: sbatch output, pickles, the files below
    "slurm_jobs": "slurm/jobs",  # "<attempt> <job id>" per submission
    "node_spec": "slurm/spec-a{attempt}.json",  # what the launcher resolved for the nodes
    "rendezvous": "slurm/master-{job}-{step}-r{restart}.json",  # node 0's address and port
    # --preflight gpu: a node's verdict
    "gpu_verdict": "slurm/gpucheck-{job}-{step}-r{restart}-node{node}.json",
}


def path(run_dir: str, what: str, **fields: object) -> str:
    """The path of `what` (a key of FILES) in run_dir, e.g. path(d, "rank_log", node=1, rank=3)."""
    return os.path.join(run_dir, FILES[what].format(**fields))


def own_path(run_dir: str, what: str, **fields: object) -> str:
    """path() for a file or directory the launcher writes: refused when it goes through a symlink
    below run_dir."""
    return no_symlink(run_dir, path(run_dir, what, **fields))


def no_symlink(run_dir: str, target: str) -> str:
    """`target` (under run_dir) when no existing component of it below run_dir is a symbolic link
    (lstat each: the launcher never writes out of the run dir through one); else a LaunchError
    naming the link."""
    rel = os.path.relpath(target, run_dir)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        raise LaunchError(
            f"{brief(target)} is outside the run dir {brief(run_dir)}; accepted: a path inside it"
        )
    here = run_dir
    for part in [] if rel == os.curdir else rel.split(os.sep):
        here = os.path.join(here, part)
        if os.path.islink(here):
            raise LaunchError(
                f"{os.path.relpath(here, run_dir)!r} in the run dir {brief(run_dir)} is a symbolic "
                "link; the launcher writes only inside the run dir (accepted: plain files and "
                "directories there)"
            )
    return target


def rank_logs(run_dir: str) -> list[tuple[int, int, str]]:
    """(node, rank, path) for every rank log present, ordered by rank."""
    found = []
    base = path(run_dir, "logs")
    for node_dir in os.listdir(base) if os.path.isdir(base) else ():
        if not (node_dir.startswith("node") and node_dir[4:].isdigit()):
            continue
        for f in os.listdir(os.path.join(base, node_dir)):
            if f.startswith("rank") and f.endswith(".log") and f[4:-4].isdigit():
                found.append((int(node_dir[4:]), int(f[4:-4]), os.path.join(base, node_dir, f)))
    return sorted(found, key=lambda t: t[1])


def stamp(t: float | None = None) -> str:
    """A local time with milliseconds as the rank logs carry it (the rank wrapper's header, the
    workloads' `resumed from` line): launchers.resilience.timeline reads it back."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def agent_header(attempt: int | str, node: int, where: str = "") -> str:
    """The line each agent start appends to its agent.log (every backend writes the same one)."""
    at = f" | {where}" if where else ""
    return f"===== launch attempt {attempt} | node {node}{at} | {time.strftime('%F %T')} =====\n"


class Presence:
    """A run dir as an attempt found it at its start (the directory's device and inode, run.yaml in
    it): gone() once it was removed or replaced while the attempt ran (`rm -rf`); gone_line() is the
    launcher's one line."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir, self.ident = run_dir, file_ident(run_dir)

    def gone(self) -> bool:
        return (
            self.ident is None
            or file_ident(self.run_dir) != self.ident
            or not os.path.exists(path(self.run_dir, "run_yaml"))
        )

    def gone_line(self) -> str:
        return (
            f"run dir {self.run_dir!r} was removed while the run ran; the job is cancelled "
            "(every rank stopped now): its records could not be kept"
        )


def file_ident(d: str) -> tuple[int, int] | None:  # (device, inode); None when it cannot be stat'ed
    try:
        st = os.stat(d)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def present(run_dir: str) -> None:
    """A record is written only into a run dir that is there: FileNotFoundError when it was removed
    (writing would recreate half a run dir)."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(errno.ENOENT, "the run dir is gone", run_dir)


# ------------------------------------------------------------------------------------ atomic writes

# in backends.base.synced_together(): its durable writes, fsynced as it ends
SYNC_LATER: list[str] | None = None


def atomic_write(path: str, text: str, durable: bool = True) -> None:
    """Replace path at once: readers (on any node) see the old file or the new one, never a part;
    durable: on disk before it returns (in backends.base.synced_together(): before that ends, with
    its other writes, at once)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp, later = f"{path}.tmp.{os.getpid()}", SYNC_LATER if durable else None
    try:
        with open(
            tmp, "w", encoding="utf-8", opener=lambda p, fl: os.open(p, fl | os.O_NOFOLLOW, 0o666)
        ) as f:
            f.write(text)
            if durable and later is None:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        later is None or later.append(path)
    except OSError:
        if os.path.exists(tmp):  # a full disk: leave no empty temporary behind
            os.unlink(tmp)
        raise


def disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON value launch writes")


def load_json(f: Any) -> Any:
    """json.load of a record: NaN/Infinity refused, a nesting too deep for the parser a ValueError
    (issue 35)."""
    import json  # here: rank wrappers import this module before their program starts

    try:
        return json.load(f, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deep") from None


def read_json(path: str) -> dict | None:
    """A JSON record, or None when it is missing or not (yet) whole."""
    try:
        with open(path, encoding="utf-8") as f:
            data = load_json(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_yaml_text(data: dict) -> str:
    """run.yaml's text: libyaml's emitter when PyYAML has it (~10x the pure-Python one's pace; the
    same document, a long or odd string perhaps wrapped or quoted otherwise)."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, allow_unicode=True)


def load_run_yaml(run_dir: str) -> tuple[dict | None, str | None]:
    """(run.yaml's record, None), or (None, why it is not a launcher's record: a short phrase)."""
    # imported where used: a Slurm node's start-up reads its spec from JSON, without yaml
    import yaml

    try:
        with open(path(run_dir, "run_yaml"), encoding="utf-8") as f:
            data = yaml.safe_load(f)  # not libyaml's parser: it crashes on deep nesting
    # UnicodeDecodeError is a ValueError
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as e:
        data = e
    why = record_problem(data)
    return (None, why) if why else (data, None)
