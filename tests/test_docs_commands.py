"""Every `launch ...` command in README.md and docs/*.md code blocks runs as the doc says (issue 36,
Acceptance).

A command is a code-block line starting `launch ` or `$ launch ` (`\\` continues it, ` ; ` separates
two); in a `$ ` block the lines up to the next `$ ` are what it prints. The comment on the line
before a block decides:
- `<!-- not run: WHY -->`: none of its commands run (a synopsis, a GPU, a container runtime);
  counted;
- `<!-- real run -->`: each command runs as written, in the doc's own scratch directory, in order;
- `<!-- output: a real run's ... -->`: the command runs with --dry-run; the output shown is a real
  run's and is not compared (it needs a cluster);
- no comment: a submit verb runs with --dry-run added (no cluster needed: no sbatch on PATH, a
  --cluster only prints its ssh command), any other verb as written. Shown output with an added
  --dry-run needs the comment above.
A command is refused when it exits non-zero (a real run may exit with the code its doc shows:
`launch: run FAILED` is 1). Output is compared line by line, in any order (ranks interleave), after
normalising times, run ids, the scratch directory (the docs' runs were in /tmp/qs2) and the host
name (`vm` in the docs); `...` in a doc line matches any text, a doc line `...` any number of lines.
A RUN argument that names no run dir there is the run dir of a tiny real run made first. README's
quickstart ends by line 80.
"""

import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import LAUNCH, ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUBMIT = {"local", "ssh", "slurm", "resume"}
RUN_VERBS = {"status", "logs", "resume", "cancel", "wait"}
DOC_CWD, DOC_HOST = "/tmp/qs2", "vm"
QUICKSTART_END, QUICKSTART_MAX_LINE = "<!-- end of quickstart -->", 80
HOSTS = "".join(f"sshhost{k} slots=2\n" for k in range(1, 5))


def blocks(path: Path) -> list[dict]:
    """The code blocks of a doc holding a launch command: {line, marker, cmds: [(argv words, shown
    output)]}."""
    out, lines, i = [], path.read_text().split("\n"), 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        j = lines.index("```", i + 1) if "```" in lines[i + 1 :] else len(lines)
        prev = next((x.strip() for x in reversed(lines[:i]) if x.strip()), "")
        marker = prev[4:-3].strip() if prev.startswith("<!--") and prev.endswith("-->") else ""
        cmds = commands(lines[i + 1 : j])
        if cmds:
            out.append({"line": i + 1, "marker": marker, "cmds": cmds})
        i = j + 1
    return out


def commands(body: list[str]) -> list[tuple[str, list[str]]]:
    cmds: list[tuple[str, list[str]]] = []
    console = any(x.startswith("$ ") for x in body)
    k = 0
    while k < len(body):
        line = body[k]
        text = line[2:] if console and line.startswith("$ ") else line if not console else None
        k += 1
        if text is None:
            cmds and cmds[-1][1].append(line)  # output of the command above
            continue
        while text.endswith("\\") and k < len(body):
            text, k = text[:-1] + " " + body[k].strip(), k + 1
        # at the line's start only
        for part in text.split(" ; ") if text.startswith("launch ") else []:
            if part.strip().startswith("launch "):
                cmds.append((part.strip(), []))
    return cmds


def normal(text: str, cwd: str, host: str) -> str:
    text = text.replace(cwd, "<cwd>")
    text = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?", "<time>", text)
    text = re.sub(r"\b(\w+)-\d{8}-\d{6}-[0-9a-f]{4}\b", r"\1-<stamp>", text)
    return re.sub(rf"\b{re.escape(host)}\b", "<host>", text)


def matches(shown: list[str], got: list[str]) -> str | None:
    """None when every shown line matches a line printed (any order; `...` within a line: any text;
    a line `...`: any number of lines), else what differs."""
    rest, more = list(got), "..." in shown
    for s in (x for x in shown if x != "..."):
        pat = re.compile(".*".join(map(re.escape, s.rstrip().split("..."))) + r"\Z")
        hit = next((g for g in rest if pat.match(g.rstrip())), None)
        if hit is None:
            return f"shown, not printed: {s!r}"
        rest.remove(hit)
    return None if more or not rest else f"printed, not shown: {rest[:3]!r}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """What the docs' commands find in their directory: hello.py (as train.py too), a hostfile
    `hosts`, the examples and workloads, a clusters file naming `dev`; and a tiny real run for the
    verbs that take RUN."""
    base = tmp_path_factory.mktemp("docs")
    tpl = base / "tpl"
    tpl.mkdir()
    for d in ("examples", "workloads"):
        shutil.copytree(ROOT / d, tpl / d, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("hello.py", "train.py"):
        shutil.copy(ROOT / "examples" / "hello.py", tpl / name)
    (tpl / "hosts").write_text(HOSTS)
    (base / "clusters.yaml").write_text(
        "dev:\n  login: login.example.org\n  runs_root: /shared/runs\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCH_")}
    env.update(
        PATH="/nonexistent-bin",
        LAUNCH_STATE_DIR=str(base / "state"),
        LAUNCH_CLUSTERS_FILE=str(base / "clusters.yaml"),
        LAUNCH_NODE_FACTS_DIR=str(base / "facts"),
    )
    p = subprocess.run(
        [
            LAUNCH,
            "local",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--run-dir",
            str(base / "done"),
            "--",
            "hello.py",
        ],
        cwd=tpl,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    return {"base": base, "tpl": tpl, "env": env, "run": str(base / "done")}


def argv(cmd: str, dry: bool, cwd: Path, run: str) -> list[str]:
    words = shlex.split(cmd, comments=True)[1:]
    verb = words[0] if words else ""
    if (
        verb in RUN_VERBS
        and len(words) > 1
        and not words[1].startswith("-")
        and not (cwd / words[1]).exists()
    ):
        words[1] = run
    if dry and verb in SUBMIT and "--dry-run" not in words:
        words.insert(words.index("--") if "--" in words else len(words), "--dry-run")
    return [LAUNCH, *words]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_runs_as_the_doc_says(doc, scratch):
    cwd = scratch["base"] / doc.stem
    shutil.copytree(scratch["tpl"], cwd)
    ran = not_run = 0
    for b in blocks(doc):
        where = f"{doc.name}:{b['line']}"
        if b["marker"].startswith("not run:"):
            not_run += len(b["cmds"])
            continue
        real, real_output = (
            b["marker"] == "real run",
            b["marker"].startswith("output: a real run's"),
        )
        for cmd, shown in b["cmds"]:
            args = argv(cmd, not real, cwd, scratch["run"])
            assert real or not shown or real_output or "--dry-run" in cmd, (
                f"{where}: `{cmd}` shows output but runs with --dry-run: mark the block `<!-- "
                "output: a real run's -->`"
            )
            p = subprocess.run(
                args, cwd=cwd, env=scratch["env"], capture_output=True, text=True, timeout=240
            )
            ran += 1
            got = (p.stdout + p.stderr).splitlines()
            failed = (
                real
                and any(x.startswith("launch: run FAILED") for x in shown)
                and p.returncode == 1
            )
            assert p.returncode == 0 or failed, (
                f"{where}: `{cmd}` refused (exit {p.returncode}):\n{p.stderr[-2000:]}"
            )
            if shown and not real_output:
                why = matches(
                    [normal(x, DOC_CWD, DOC_HOST) for x in shown],
                    [normal(x, str(cwd), socket.gethostname()) for x in got],
                )
                assert why is None, f"{where}: `{cmd}`: {why}\n--- printed:\n" + "\n".join(got)
    print(f"{doc.name}: {ran} commands run, {not_run} not run (marked)")


def test_quickstart_is_near_the_top():
    lines = (ROOT / "README.md").read_text().split("\n")
    assert QUICKSTART_END in lines, "README.md lost its quickstart end marker"
    assert lines.index(QUICKSTART_END) + 1 <= QUICKSTART_MAX_LINE


def test_a_synopsis_is_marked_not_run():
    """The extraction itself: a doc block whose lines are a synopsis (`[...]`, `|`, `...`) must say
    `not run`, else it would be run as written and refused."""
    for doc in DOCS:
        for b in blocks(doc):
            for cmd, _ in b["cmds"]:
                if re.search(r"\s\[|\s\.\.\.(\s|$)|\s\|\s|<\w", cmd):
                    assert b["marker"].startswith("not run:"), (
                        f"{doc.name}:{b['line']}: `{cmd}` is a synopsis"
                    )


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to
    `-`."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_every_link_is_true():
    """Each relative link of README.md and docs/*.md names a file of the checkout (and a heading of
    it)."""
    bad = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            heads = (
                [slug(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)]
                if dest.is_file()
                else []
            )
            if not dest.exists() or (anchor and anchor not in heads):
                bad.append(f"{doc.name}: {target}")
    assert bad == []
