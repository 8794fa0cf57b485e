"""The log tailer (launchers.follow.LogTail) prints each file's whole lines with its prefix, decoded
per line with replacement, whatever the chunks its files grow by: checked against the per-line
rule itself, over random appends (partial lines, invalid and split UTF-8, control sequences), to a
text stream and to ones over bytes."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launchers.follow import LogTail
from launchers.show import clean

PIECES = st.sampled_from(
    [b"a", b"xyz", b"\n", b"\n\n", b"\xe2\x82", b"\xac", b"\xff", b"\xc3\xa9", b"\x1b[31m", b"\r"]
)
APPENDS = st.lists(
    st.tuples(st.integers(0, 1), st.lists(PIECES, max_size=6).map(b"".join)), max_size=12
)


def expected(appends, raw: bool) -> list[str]:
    """Every printed line, file by file: a file's bytes split at newlines, each line decoded alone
    (an unterminated last line printed too, at the final poll)."""
    lines = []
    for i in (0, 1):
        data = b"".join(b for f, b in appends if f == i)
        parts = data.split(b"\n")
        for ln in parts if parts[-1] else parts[:-1]:
            text = ln.decode("utf-8", "replace")
            lines.append(f"[f{i}] " + (text if raw else clean(text)))
    return lines


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(appends=APPENDS, raw=st.booleans(), encoding=st.sampled_from([None, "utf-8", "utf-16"]))
def test_lines_whatever_the_chunks(tmp_path_factory, appends, raw, encoding):
    d = tmp_path_factory.mktemp("logs")
    paths = [d / "f0.log", d / "f1.log"]
    for p in paths:
        p.write_bytes(b"")
    # like sys.stdout (a text layer over bytes: ASCII lines go to its bytes where its encoding
    # writes ASCII as is), or text only
    out = io.TextIOWrapper(io.BytesIO(), encoding=encoding) if encoding else io.StringIO()
    out.write("launch: started\n")  # the launcher's own line, still in the text layer's buffer
    tail = LogTail(lambda: [(f"[f{i}] ", str(p)) for i, p in enumerate(paths)], out, raw=raw)
    printed = 0
    for f, b in appends:
        with open(paths[f], "ab") as fh:
            fh.write(b)
        printed += tail.poll()
    printed += tail.poll(final=True)
    out.flush()
    got = out.buffer.getvalue().decode(encoding) if encoding else out.getvalue()
    assert got.startswith("launch: started\n") and got.endswith("\n")
    got_lines = got.split("\n")[1:-1]
    assert printed == len(got_lines)
    # per file, in order; the files' lines interleave by poll
    for i in (0, 1):
        mine = [ln for ln in got_lines if ln.startswith(f"[f{i}] ")]
        assert mine == [ln for ln in expected(appends, raw) if ln.startswith(f"[f{i}] ")]
