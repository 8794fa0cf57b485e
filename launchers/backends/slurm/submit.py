"""Submitting the rendered sbatch script through submitit -- in this process, or from a warm forked
one.

submitit (with cloudpickle, asyncio, logging.config, ...) takes ~60-70 ms to import, more than
everything else `launch slurm` does before sbatch. So the CLI, once it knows it will submit (not a
dry-run, not inside an allocation), forks a *warm submitter*: it imports submitit on the other core
while the launcher checks the options, asks Slurm (`sbatch --test-only`) and creates the run dir;
then it is handed the finished request over a pipe, submits it exactly as the in-process path does
(submit()), and sends back the job id or the refusal. If the launcher ends without handing it
anything (bad input, Ctrl-C), the submitter sees EOF and exits having submitted nothing. Callers of
the Python API submit in-process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ... import layout
from ...credentials.secretenv import handover
from .jobctl import one_line
from .options import slurm_options

if TYPE_CHECKING:
    from ...spec import RunSpec


class SubmitError(Exception):
    """sbatch (or submitit) refused the job; the message is what to show the user."""


class SubmitterGone(Exception):
    """The warm submitter ended before it was handed the request: nothing was submitted, submit
    in-process."""


@dataclass(frozen=True)
class SubmitRequest:
    """One submission, as the launcher hands it to submit() (in-process or over the warm submitter's
    pipe)."""

    folder: str  # submitit's folder (layout.path(run_dir, "slurm"))
    script: str  # the plan's sbatch script, submitted verbatim
    nodes: int
    max_requeues: int
    python: str
    run_dir: str
    attempt: int
    # for the sbatch call only (run.yaml shows ***)
    secret_env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "SubmitRequest":
        return cls(**json.loads(text))


def submit(req: SubmitRequest) -> str:
    """Submit req.script with submitit's SlurmExecutor; the job id. req.secret_env is put in the
    environment for the sbatch call only: run.yaml shows those values as ***, sbatch exports them to
    the job."""
    from submitit.core.utils import FailedJobError, FailedSubmissionError
    from submitit.slurm.slurm import SlurmExecutor

    from .task import NodeTask

    script = req.script

    class Executor(SlurmExecutor):  # submits exactly the script the plan shows
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return script

    os.makedirs(req.folder, exist_ok=True)
    ex = Executor(
        folder=req.folder, max_num_timeout=req.max_requeues, python=shlex.quote(req.python)
    )
    ex.parameters.update(nodes=req.nodes, ntasks_per_node=1)
    saved = {k: os.environ.get(k) for k in req.secret_env}
    os.environ.update(req.secret_env)
    try:
        job = ex.submit(NodeTask(req.run_dir, req.attempt))
    except (FailedJobError, FailedSubmissionError, OSError, RuntimeError) as e:
        raise SubmitError(str(e)) from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return str(job.job_id)


class WarmSubmitter:
    """A forked process that imports submitit now and submits one request later (see the module
    doc)."""

    def __init__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        req_r, self._req_w = os.pipe()
        self._res_r, res_w = os.pipe()
        try:
            self.pid = os.fork()
        except OSError:
            for fd in (req_r, self._req_w, self._res_r, res_w):
                os.close(fd)
            raise
        if self.pid == 0:  # the child never returns into the launcher's code
            code = 1
            try:
                os.close(self._req_w)
                os.close(self._res_r)
                code = _serve(req_r, res_w)
            finally:
                # no atexit handlers, no flush of buffers inherited from the launcher
                os._exit(code)
        os.close(req_r)
        os.close(res_w)

    def submit(self, req: SubmitRequest) -> str:
        """The job id, or SubmitError; SubmitterGone when the request could not be handed over."""
        try:
            os.write(self._req_w, req.to_json().encode())  # a few KB: fits the pipe buffer
        except BrokenPipeError:
            self.close()
            raise SubmitterGone() from None
        finally:
            self._close_request()
        answer = _read_all(self._res_r)
        os.close(self._res_r)
        _, status = os.waitpid(self.pid, 0)
        if not answer:
            raise SubmitError(
                f"the warm submitter (pid {self.pid}) ended without an answer "
                f"(exit status {os.waitstatus_to_exitcode(status)})"
            )
        res = json.loads(answer)
        if "error" in res:
            raise SubmitError(res["error"])
        return res["job_id"]

    def close(self) -> None:
        """Nothing to submit after all: the child sees EOF and exits."""
        self._close_request()
        with contextlib.suppress(OSError):
            os.close(self._res_r)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def _close_request(self) -> None:
        if self._req_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._req_w)
            self._req_w = None


def _read_all(fd: int) -> bytes:
    """Everything until the other end closes its side of the pipe."""
    chunks = []
    while b := os.read(fd, 65536):
        chunks.append(b)
    return b"".join(chunks)


def _serve(req_r: int, res_w: int) -> int:
    # Ctrl-C stops the launcher; this one then sees EOF
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import submitit.slurm.slurm  # noqa: F401  (the point of this process: import while the launcher works)

    from .task import NodeTask  # noqa: F401  (submitit's Checkpointable)

    request = _read_all(req_r)
    if not request:
        return 0
    try:
        out: dict[str, Any] = {"job_id": submit(SubmitRequest.from_json(request))}
    except SubmitError as e:
        out = {"error": str(e)}
    except Exception as e:  # noqa: BLE001 (reported to the launcher, which shows it in one line)
        out = {"error": f"{type(e).__name__}: {e}"}
    os.write(res_w, json.dumps(out).encode())
    return 0


_warm: WarmSubmitter | None = None


def prestart() -> None:
    """CLI only: fork the warm submitter (single-threaded at this point), used by the next
    submission."""
    global _warm
    if _warm is None:
        try:
            _warm = WarmSubmitter()
        except OSError:  # no fork (e.g. a process limit): the submission happens in-process
            _warm = None


def take() -> WarmSubmitter | None:
    global _warm
    w, _warm = _warm, None
    return w


def discard() -> None:
    """The launcher is done without submitting: let the warm submitter go."""
    w = take()
    if w is not None:
        w.close()


class SubmitFailed(Exception):
    """sbatch (through submitit) refused the script; the message is one line."""


def submit_script(spec: RunSpec, script: str, run_dir: str, attempt: int) -> str:
    """Submit `script` through submitit (the warm submitter when there is one) from run_dir/slurm;
    the job id."""
    req = SubmitRequest(
        folder=layout.path(run_dir, "slurm"),
        script=script,
        nodes=spec.nodes,
        max_requeues=slurm_options(spec)["max_requeues"],
        python=spec.python,
        run_dir=run_dir,
        attempt=attempt,
        secret_env=secret_env(spec),
    )
    warm = take()
    try:
        if warm is not None:
            try:
                return warm.submit(req)
            except SubmitterGone:
                pass  # it never got the request: submit from here
        return submit(req)
    except SubmitError as e:
        raise SubmitFailed(one_line(str(e))) from None


def secret_env(spec: RunSpec) -> dict[str, str]:
    """run.yaml shows secret --env values as *** and --secret by name; the nodes take them from the
    job's environment (sbatch exports the submitter's: slurmctld keeps it in its state dir while the
    job lives), so they are put there for the sbatch call only, never in the script nor on sbatch's
    command line."""
    return handover(spec, os.environ)
