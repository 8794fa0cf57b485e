"""`launch`: click commands only (parse, call, print). Never imports torch."""
from __future__ import annotations

import contextlib
import functools
import re
import sys

import click

from . import __version__
from .clihelp import EXAMPLES as VERB_EXAMPLES
from .clihelp import Grouped, Shown, option_of, renamed
from .errors import LaunchError
from .runopts import BACKEND_OPTIONS, COMMON, Opt, envvar, options_from_cli

EXAMPLES = """
\b
Examples:
  launch local --nodes 4 --gpus-per-node 2 --run-dir runs/demo -- -m workloads.convnet --epochs 2
  launch slurm --nodes 4 --gpus-per-node 8 --partition gpu --time 04:00:00 -- train.py --lr 3e-4
  launch ssh --hostfile hosts --run-dir /shared/runs/exp1 -- train.py --lr 3e-4
  launch slurm ... --dry-run            # print the sbatch script and each node's command
  launch status runs/demo ; launch logs runs/demo --rank 3 -f ; launch list
  launch resume runs/demo [--nodes 1 --gpus-per-node 2] [-- new program args]
  launch nccl check moe ; launch nccl show moe --format sbatch
"""

RUN_SETTINGS = {"ignore_unknown_options": True, "allow_interspersed_args": False, "help_option_names": ["-h", "--help"]}


def _errors(fn):
    """One-line error and exit code 2 for bad input; nothing has been started when it is raised."""
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except LaunchError as e:
            click.echo(f"launch: error: {e}", err=True)
            sys.exit(e.exit_code)
    return wrapper


def usage_exit(e: click.UsageError) -> None:
    """click's usage errors (unknown option, bad value, missing argument) in the one-line form, exit 2; a bare
    `launch` or `launch nccl` (click 8.2+ makes it an error; 8.1 exits 0 itself) prints the help, exit 0."""
    if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())) and e.ctx:
        click.echo(e.ctx.get_help())
        sys.exit(0)
    path = e.ctx.command_path if e.ctx else "launch"
    msg = " ".join(e.format_message().split()).rstrip(".")
    if isinstance(e, click.NoSuchOption) and e.ctx:
        msg += "; accepted: " + ", ".join(sorted({o for p in e.ctx.command.get_params(e.ctx) for o in p.opts
                                                  if o.startswith("-")}))
    elif e.ctx and isinstance(e.ctx.command, click.Group) and msg.startswith("No such command"):
        msg += "; accepted: " + ", ".join(e.ctx.command.list_commands(e.ctx))
    click.echo(f"launch: error: {path}: {msg} (see `{path} --help`)", err=True)
    sys.exit(2)


class LazyGroup(click.Group):
    """Subcommands from other packages are imported only when used (keeps `launch --help` fast); click's usage
    errors, here and in every subcommand, are printed in the project's one-line form (usage_exit)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            usage_exit(e)

    def parse_args(self, ctx, args):
        ctx.meta["launch.argv"] = list(args)          # the verb and its words as given (--cluster passes them on)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            usage_exit(e)

    lazy = {"nccl": ("nccl_tuning.cli", "nccl", "NCCL presets: list, show, check; collective bench and sweep."),
            "nodes": ("launchers.nodescli", "nodes", "The site's node ledger: each host's strikes and state.")}

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx, name):
        if name in self.lazy:
            import importlib
            module, attr, _ = self.lazy[name]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy:
                rows.append((name, self.lazy[name][2]))
            else:
                rows.append((name, super().get_command(ctx, name).get_short_help_str(limit=70)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="launch")
def main() -> None:
    """Start multi-node PyTorch (torchrun) jobs on this machine, SSH hosts or Slurm, with one run directory."""


def job_options(backend: str):
    """The common options and the backend's own, generated from their one declaration (launchers.runopts)."""
    def wrap(fn):
        opts = [option_of(o, envvar(backend, o)) for o in (*COMMON, *BACKEND_OPTIONS[backend]) if o.cli_flag]
        opts.append(click.argument("program", nargs=-1, type=click.UNPROCESSED))
        for o in reversed(opts):
            fn = o(fn)
        return fn
    return wrap


def _via_cluster(fn):
    """--cluster NAME: the verb runs on that cluster's login node, its words as given (launchers.viacluster)."""
    @functools.wraps(fn)
    def wrapper(*a, cluster=None, **kw):
        if not cluster:
            return fn(*a, **kw)
        return _errors(_forward)(cluster)
    return click.option("--cluster", default=None, metavar="NAME", help="Run it on that cluster's login node over "
                        "SSH (the clusters file); `launch list --cluster all`: every cluster.")(wrapper)


def _forward(cluster: str, profile: str | None = None) -> None:
    from .viacluster import forward
    ctx = click.get_current_context()
    verb, *args = ctx.find_root().meta["launch.argv"]
    sys.exit(forward(verb, args, cluster, profile))


def _launch(backend: str, kw: dict) -> None:
    from . import api
    from .runjson import scripted
    from .spec import build_spec
    common = {o.key: kw.pop(o.key) for o in COMMON}
    program, dry_run, profile = kw.pop("program"), common.pop("dry_run"), common.pop("profile")
    sweep, as_json = common.pop("sweep"), common.pop("json")
    with _env_named({o.key: (o.cli_flag, envvar(backend, o)) for o in (*COMMON, *BACKEND_OPTIONS[backend])}):
        # a LAUNCH_* value refused (here or by the backend's preflight) is named
        common["options"] = options_from_cli(backend, kw)
        requeued = not sweep and api.requeued(backend, common.get("run_dir"))   # the user's job, requeued
        spec = build_spec(backend, common, list(program), profile, existing=bool(requeued))
        if requeued:                  # its run continues (launchers.backends.slurm.inalloc)
            sys.exit(scripted(as_json, dry_run, spec.run_dir, functools.partial(api.continue_requeued, spec)))
        if sweep:                     # one run per combination (launchers.sweeprun)
            from .sweeprun import submit_sweep
            sys.exit(scripted(as_json, dry_run, spec.run_dir, functools.partial(submit_sweep, spec, sweep)))
        sys.exit(scripted(as_json, dry_run, spec.run_dir, functools.partial(api.submit, spec)))


@contextlib.contextmanager
def _env_named(variables: dict[str, tuple[str | None, str | None]]):
    """A bad value that came from a LAUNCH_* variable (variables: option key -> its flag and variable): the error
    names the variable next to its flag."""
    ctx = click.get_current_context()
    env = {flag: var for key, (flag, var) in variables.items()
           if flag and var and ctx.get_parameter_source(key) == click.core.ParameterSource.ENVIRONMENT}
    try:
        yield
    except LaunchError as e:
        msg = str(e)
        for flag, var in env.items():
            if re.search(re.escape(flag) + r"\b(?!-)", msg):
                msg = re.sub(re.escape(flag) + r"\b(?!-)", f"{flag} (from ${var})", msg, count=1)
        raise type(e)(msg) from None          # its kind kept (RunDirGone: exit 1)


@main.command(cls=Grouped, context_settings=RUN_SETTINGS, epilog=VERB_EXAMPLES["local"])
@job_options("local")
@_errors
def local(**kw):
    """Run N simulated nodes on this machine (one torchrun agent per node)."""
    _launch("local", kw)


@main.command(cls=Grouped, context_settings=RUN_SETTINGS, epilog=VERB_EXAMPLES["ssh"])
@job_options("ssh")
@_errors
def ssh(**kw):
    """Run on SSH-reachable hosts without a scheduler (SSH through paramiko, verified host keys)."""
    _launch("ssh", kw)


@main.command(cls=Grouped, context_settings=RUN_SETTINGS, epilog=VERB_EXAMPLES["slurm"])
@job_options("slurm")
@_errors
def slurm(**kw):
    """Submit through sbatch (submitit); inside an allocation, start one torchrun per allocated node."""
    from .spec import load_profile  # --cluster NAME ('': here), else the profile's slurm.cluster (not viacluster:
    flag, prof = kw["cluster"], kw["profile"]                  # a plain submit never imports that, ~60-90 ms)
    cluster = flag if flag is not None else (load_profile(prof).get("slurm") or {}).get("cluster") if prof else None
    if cluster:
        _forward(cluster, kw["profile"])
    _launch("slurm", kw)


@main.command(epilog=VERB_EXAMPLES["resume"])
@_via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option("--nodes", default=None, type=Shown("INTEGER"), help="New node count (the checkpoint is resharded).")
@click.option("--gpus-per-node", default=None, type=Shown("INTEGER"), help="New processes per node.")
@click.option("--max-restarts", default=None, type=Shown("INTEGER"), help="New number of whole-job restarts "
              "from checkpoints/latest.")
@click.option("--dry-run", is_flag=True, help="Print exactly what would run; start nothing.")
@click.option("--adopt", is_flag=True, help="RUN is a copy of another run dir: resume it as a run of its own "
              "(a new run id).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout (launch local --help: --json).")
@option_of(Opt("snapshot", (bool,), "Default: keep the run's snapshot. --snapshot: a new snapshot of the run's "
                   "tree as it is now; --no-snapshot: run from the tree itself.", kind="switch"))
@click.argument("program_args", nargs=-1, type=click.UNPROCESSED)
@_errors
def resume(run, nodes, gpus_per_node, max_restarts, dry_run, adopt, as_json, snapshot, program_args):
    """Start a new attempt of RUN; the workload continues from checkpoints/latest.

    New program arguments (replacing the recorded ones) go after `--`. Every path of the attempt is RUN where
    it is now: a moved run dir resumes into itself. A copy (`cp -a`) still holds the original's run id and is
    refused, naming the original, unless --adopt gives it its own; the original is never written.
    """
    from . import api, runindex
    from .runjson import scripted
    from .spec import positive_int
    changes = {"nodes": positive_int("--nodes", nodes) if nodes is not None else None,
               "gpus_per_node": positive_int("--gpus-per-node", gpus_per_node) if gpus_per_node is not None else None,
               "max_restarts": positive_int("--max-restarts", max_restarts, 0) if max_restarts is not None else None,
               "snapshot": snapshot}
    run = runindex.resolve(run)                    # a run name or a Slurm job id too
    sys.exit(scripted(as_json, dry_run, run, functools.partial(api.resume, run, changes, tuple(program_args)
                                                               if program_args else None, adopt=adopt)))


@main.command(epilog=VERB_EXAMPLES["status"])
@_via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--ranks", is_flag=True, help="Per rank: last step, age of its last progress, step time, straggler.")
@click.option("--manifest", "with_manifest", is_flag=True, help="Also what ran: manifest.json (git commit and diff "
              "hash, snapshot, image, command line, NCCL env, hosts; rank 0's Python/torch/CUDA/NCCL/DeepSpeed "
              "versions and package list hash).")
@_errors
def status(run, as_json, ranks, with_manifest):
    """State, per-node exit codes, first failure, hang, NCCL refusals, snapshot and last step of RUN."""
    import json

    from . import api, manifest, show
    st = api.status(run, ranks=ranks, verify=True)     # the latest checkpoint's sha256 as well
    if with_manifest:
        st["manifest"] = manifest.read(st["run_dir"])
    if as_json:
        click.echo(json.dumps(st, indent=1, sort_keys=True, default=str))
    else:
        show.status(api.format_status(st))       # a terminal: rich tables; otherwise the plain text
        if with_manifest:
            show.status("\n".join(manifest.format_manifest(st["manifest"], manifest.path(st["run_dir"]))))


@main.command(epilog=VERB_EXAMPLES["top"])
@click.argument("runs", nargs=-1, metavar="[RUN]...", type=Shown("RUN", complete="run"))
@click.option("--interval", default="2", show_default=True, type=Shown("SECONDS"), help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print the view once and exit.")
@_errors
def top(runs, interval, once):
    """Live view of RUN's ranks (default: the runs not ended): step, steps/s, ETA, last seen, straggler, hang
    flags; this machine's GPUs. `q` or Ctrl-C quits; the job is never touched."""
    from . import top as view
    from .values import parse_number
    seconds = parse_number("--interval", interval, "a number of seconds from 0.1 up")
    if seconds < 0.1:
        raise LaunchError(f"--interval {interval} is out of range; give a number of seconds from 0.1 up")
    view.top(list(runs), seconds, once)


@main.command(epilog=VERB_EXAMPLES["logs"])
@_via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option("--rank", default=None, type=Shown("INTEGER"), help="Only this global rank (unprefixed).")
@click.option("-f", "--follow", is_flag=True, help="Keep following until the run ends.")
@click.option("--raw", is_flag=True, help="Print the lines as written (terminal control sequences kept).")
@_errors
def logs(run, rank, follow, raw):
    """Print RUN's per-rank logs, each line prefixed "[nK rR]" (the last MiB of a larger log)."""
    from . import api
    from .rundir import TERMINAL
    from .values import parse_int
    tail = api.log_tail(run, parse_int("--rank", rank, 0) if rank is not None else None, raw=raw)
    if follow:
        tail.follow(lambda: api.status(run)["state"] in TERMINAL)
    else:
        tail.poll(final=True)


@main.command(name="list", epilog=VERB_EXAMPLES["list"])
@_via_cluster
@click.option("--runs-root", "root", default=None, type=Shown("DIR", complete="dir"),
              help="Runs root (default $LAUNCH_RUNS_ROOT or ./runs).")
@renamed("--root", "root", "--runs-root")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a list of objects).")
@_errors
def list_(root, as_json):
    """Runs, newest first: those under the runs root and, from the runs index, those made elsewhere."""
    from . import api, show
    rows = api.list_runs(root)
    if as_json:
        import json
        click.echo(json.dumps(rows, indent=1))
        return
    show.table(("NAME", "BACKEND", "SHAPE", "STATE", "AGE"),
               [(r["name"], r["backend"], r["shape"], r["state"] + (f" ({r['reason']})" if r.get("reason") else ""),
                 r["age"]) for r in rows])


@main.command(epilog=VERB_EXAMPLES["cancel"])
@_via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout: the run's state, `cancelled`.")
@_errors
def cancel(run, as_json):
    """Stop RUN on every node (scancel on Slurm); nothing of it keeps running.

    A run that already ended (COMPLETED, FAILED, CANCELLED) is left as it is: one line on stderr
    says so and the exit code is 0 (nothing of it runs, as asked).
    """
    from . import api, runindex, runjson
    run = runindex.resolve(run)                    # a run name or a Slurm job id too
    ended = api.cancel(run)
    if as_json:
        runjson.emit(dict(runjson.run_record(run), cancelled=not ended))
    elif ended:
        click.echo(f"launch: run {run} already ended ({ended}); nothing to cancel", err=True)
    else:
        click.echo(f"cancelled {run}")


@main.command(name="wait", epilog=VERB_EXAMPLES["wait"])
@_via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option("--timeout", default=None, type=Shown("SECONDS"), help="Seconds to wait at most; then exit 124 (as "
              "timeout(1)), the run left as it is.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout: the run's end (exit_code).")
@_errors
def wait_(run, timeout, as_json):
    """Follow RUN until it ends; exit 0 only if every rank succeeded (124: --timeout ran out)."""
    from . import api, runindex, runjson
    from .spec import parse_seconds
    secs, run = parse_seconds("--timeout", timeout) if timeout is not None else None, runindex.resolve(run)
    sys.exit(runjson.waited(as_json, run, lambda: api.wait(run, timeout=secs)))


@main.command(epilog=VERB_EXAMPLES["completion"])
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]), default="bash")
def completion(shell):
    """Print the shell's completion script (bash, zsh, fish).

    Use: `eval "$(launch completion bash)"` in ~/.bashrc (click's `_LAUNCH_COMPLETE=bash_source launch` is the same).
    """
    from click.shell_completion import get_completion_class
    comp = get_completion_class(shell)(main, {}, "launch", "_LAUNCH_COMPLETE")
    click.echo(comp.source())


def _doctor_options(fn):
    """`launch doctor`'s options, generated from their declarations (launchers.doctor.options), with the LAUNCH_*
    defaults of the verb it checks for (`launch ssh`'s LAUNCH_SSH_*, `launch slurm`'s LAUNCH_SLURM_*)."""
    from .doctor.options import OPTIONS, env_default
    for o in reversed(OPTIONS):
        fn = option_of(o, (env_default(o) or (None,))[0])(fn)
    return renamed("--run-root", "run_root", "--runs-root")(fn)


@main.command(cls=Grouped, epilog=VERB_EXAMPLES["doctor"])
@_via_cluster
@_doctor_options
@_errors
def doctor(**kw):
    """Check nodes before a long job: --local, --hosts/--hostfile (SSH) or --slurm; exit 1 if a check fails.

    A LAUNCH_* default counts where the verb checked for takes it: LAUNCH_SSH_* for SSH hosts, LAUNCH_SLURM_*
    with --slurm, LAUNCH_NODES, LAUNCH_GPUS_PER_NODE and LAUNCH_PYTHON for every target (not LAUNCH_NODES with
    --local)."""
    from .doctor.main import run
    from .doctor.options import OPTIONS, env_applies, env_default
    ctx = click.get_current_context()
    target = "local" if kw.get("local") else "slurm" if kw.get("slurm") else "ssh"
    for key in kw:
        if ctx.get_parameter_source(key) == click.core.ParameterSource.ENVIRONMENT and not env_applies(key, target):
            kw[key] = None                    # another verb's default (LAUNCH_SSH_HOSTFILE with --slurm)
    with _env_named({o.key: (o.cli_flag, (env_default(o) or (None,))[0]) for o in OPTIONS}):
        sys.exit(run(kw))


if __name__ == "__main__":
    main()
