"""Differential test: NCCL's own C parsers, compiled from the source copies, against the Python
models in nccl_tuning.cmodel, on >= 1000 generated values per parser and NCCL tag.

At test time the functions are cut out of ../shared/reference/nccl/src/nccl-<tag>/ (parseList and
getNthreads from src/graph/tuning.cc, ncclLoadParam from src/misc/param.cc, the NCCL_DEBUG_SUBSYS
loop of src/debug.cc up to 2.27, the 2.30 enum/bitset parsers of src/include/param/ with the
option tables of src/debug.cc) and compiled with the system C++ compiler next to small stubs
(ncclResult_t, WARN/INFO, and for 2.30 the missing param/utils.h: trim = strip C whitespace,
iequals = ASCII case-insensitive; those two are assumptions, the copies do not contain them).
Nothing of NCCL is kept in the repository. No compiler or no copies: the test fails.
Inputs come from a seeded generator built from each parser's own alphabet (element names in
random case, separators, '^', spaces, junk, octal/hex/overflowing numbers).
"""
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nccl_tuning import cmodel
from nccl_tuning import ncclsrc as S

SRC = Path(__file__).resolve().parents[2] / "shared" / "reference" / "nccl" / "src"
N = 1200                       # generated values per parser and tag
SEED = 14

STUBS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <errno.h>
#include <stdint.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/wait.h>
#include <algorithm>
#include <mutex>
#include <string>
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2,
               ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5 } ncclResult_t;
#define WARN(...) do {} while (0)
#define INFO(...) do {} while (0)
#define NCCL_ALL_LOG 0
#define WARP_SIZE 32
static const char* ncclGetEnv(const char* name) { return getenv(name); }
static void ncclGetCachePolicy(char const*, int8_t* noCache) { *noCache = 1; }
#define COMPILER_ATOMIC_LOAD(p, o) (*(p))
#define COMPILER_ATOMIC_STORE(p, v, o) (*(p) = (v))
static std::string unhex(const char* h) {
  std::string s; for (size_t i = 0; h[i] && h[i+1] && h[i] != '\n'; i += 2) {
    char b[3] = {h[i], h[i+1], 0}; s += (char)strtol(b, NULL, 16); } return s; }
"""


def need(path: Path) -> str:
    if not path.is_file():
        pytest.fail(f"NCCL source copy {path} is missing (expected ../shared next to the repo)")
    return path.read_text(errors="replace")


def compiler() -> str:
    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.fail("no C++ compiler (c++/g++) on PATH: the differential test needs one "
                    "(apt-get install -y build-essential)")
    return cxx


def function(text: str, signature: str) -> str:
    """The top-level C function starting with `signature` up to its closing '}' at column 0."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(signature))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return "\n".join(lines[start:end + 1])


def braced(text: str, opener: str, open_ch="{", close_ch="}") -> str:
    """From `opener` (which ends with open_ch) to its matching close_ch."""
    i = text.index(opener)
    j, depth = i + len(opener), 1
    while depth:
        depth += {open_ch: 1, close_ch: -1}.get(text[j], 0)
        j += 1
    return text[i:j]


def subsys_defines(tag) -> str:
    names = sorted(set(S.debug_subsys((2, 30, 7))) - {"ALL"})
    return "\n".join(f"#define NCCL_{n} ((uint64_t)1 << {i})" for i, n in enumerate(names)) + \
        "\n#define NCCL_ALL (~(uint64_t)0)\n"


def subsys_options(tag):
    names = sorted(set(S.debug_subsys((2, 30, 7))) - {"ALL"})
    bit = {n: 1 << i for i, n in enumerate(names)}
    return [(n, (2**64 - 1) if n == "ALL" else bit[n]) for n in S.debug_subsys(tag)]


def harness(tag) -> str:
    base = SRC / f"nccl-{S.vstr(tag)}" / "src"
    tuning = need(base / "graph" / "tuning.cc")
    param = need(base / "misc" / "param.cc")
    debug = need(base / "debug.cc")
    new = tag >= (2, 24, 3)
    code = [STUBS, subsys_defines(tag), function(tuning, "static int getNthreads("),
            function(tuning, "ncclResult_t parseList(")]
    load = function(param, "int64_t ncclLoadParam(" if tag >= (2, 30, 7) else "void ncclLoadParam(")
    code.append(load.replace("std::lock_guard<std::mutex> lock(mutex);", "(void)mutex;"))
    if tag < (2, 30, 7):
        block = braced(debug, "if (ncclDebugSubsysEnv != NULL) {")
        code.append("static uint64_t subsys_old(const char* in) {\n  uint64_t ncclDebugMask = 0, "
                    "tempNcclDebugMask = 0;\n  char* ncclDebugSubsysEnv = (char*)in;\n" + block +
                    "\n  return ncclDebugMask | tempNcclDebugMask;\n}")
    else:
        code.append(_v30_parsers(debug))
    load_call = ("ncclLoadParam(\"NCCL_DIFF_X\", -2, INT64_MIN, &cache, &nc)" if tag >= (2, 30, 7)
                 else "(ncclLoadParam(\"NCCL_DIFF_X\", -2, INT64_MIN, &cache), cache)")
    call_list = ("int rc = parseList(v.c_str(), funcs, 5, algo ? algos : protos, ne, list); "
                 "int n = 5 * ne;" if new else
                 "int rc = parseList(v.c_str(), algo ? algos : protos, ne, list); int n = ne;")
    if tag >= (2, 30, 7):
        call_subsys = ('uint64_t m; if (subsys30(v.c_str(), m)) printf("%llu\\n", '
                       '(unsigned long long)m); else printf("X\\n");')
        call_level = 'printf("%d\\n", level30(v.c_str()));'
    else:
        call_subsys = 'printf("%llu\\n", (unsigned long long)subsys_old(v.c_str()));'
        call_level = "return 2;"
    algos = ", ".join(f'"{a}"' for a in S.algorithms(tag))
    funcs = ", ".join(f'"{f}"' for f in S.FUNCS)
    code.append(f"""
static const char* algos[] = {{{algos}}};
static const char* protos[] = {{"LL", "LL128", "Simple"}};
static const char* funcs[] = {{{funcs}}};
static int64_t load(const std::string& v) {{
  setenv("NCCL_DIFF_X", v.c_str(), 1);
  int64_t cache = INT64_MIN; int8_t nc = -1; (void)nc;
  return {load_call};
}}
int main(int argc, char** argv) {{
  char line[8192];
  const char* mode = argv[1];
  int nal = {len(S.algorithms(tag))};
  while (fgets(line, sizeof line, stdin)) {{
    std::string v = unhex(line);
    fflush(stdout);
    pid_t pid = fork();             /* NCCL's code may crash on an input: one child per value */
    if (pid != 0) {{
      int st = 0; waitpid(pid, &st, 0);
      if (WIFSIGNALED(st)) printf("SIG%d\\n", WTERMSIG(st));
      continue;
    }}
    if (!strcmp(mode, "algo") || !strcmp(mode, "proto")) {{
      int algo = !strcmp(mode, "algo"); int ne = algo ? nal : 3;
      int list[5 * 16];
      for (int f = 0; f < 5; f++) for (int e = 0; e < ne; e++)
        list[f * ne + e] = (!algo && e == 1) ? 2 : 1;
      {call_list}
      printf("%d", rc); if (rc == 0) for (int i = 0; i < n; i++) printf(" %d", list[i]);
      printf("\\n");
    }} else if (!strcmp(mode, "int")) {{
      printf("%lld\\n", (long long)load(v));
    }} else if (!strcmp(mode, "nthreads")) {{
      int env = (int)load(v);
      printf("%d %d\\n", getNthreads("NCCL_NTHREADS", env, 2 * WARP_SIZE, 512, 256),
             getNthreads("NCCL_LL128_NTHREADS", env, 640 / 4, 640, 640));
    }} else if (!strcmp(mode, "subsys")) {{
      {call_subsys}
    }} else if (!strcmp(mode, "level")) {{
      {call_level}
    }}
    fflush(stdout); _exit(0);
  }}
  return 0;
}}
""")
    return "\n".join(code)


def _v30_parsers(debug: str) -> str:
    """2.30: the real parser headers (copied into the build dir at test time) with the option
    tables cut out of debug.cc."""
    levels = braced(debug, "ncclParamOneOf<ncclDebugLogLevel>(", "(", ")")
    subsys = braced(debug, "(ncclParamBitsetOf<ncclDebugLogSubSys, uint64_t>(", "(", ")")
    return f"""
typedef enum {{ NCCL_LOG_NONE = 0, NCCL_LOG_VERSION = 1, NCCL_LOG_WARN = 2, NCCL_LOG_INFO = 3,
               NCCL_LOG_ABORT = 4, NCCL_LOG_TRACE = 5 }} ncclDebugLogLevel;
typedef uint64_t ncclDebugLogSubSys;
#include "param/parser_common.h"
#include "param/parser_enum.h"
#include "param/parser_bitset.h"
static int level30(const char* in) {{
  static auto p = {levels};
  ncclDebugLogLevel out; return p.resolve(in, out) == ncclSuccess ? (int)out : -1;
}}
static bool subsys30(const char* in, uint64_t& out) {{
  static auto p = {subsys[1:]};
  return p.resolve(in, out) == ncclSuccess;
}}
"""


UTILS = r"""
#pragma once
#include <string>
#include <cctype>
namespace nccl { namespace param { namespace utils {
inline std::string trim(const std::string& s) {
  const char* ws = " \t\n\v\f\r";
  size_t b = s.find_first_not_of(ws); if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(ws); return s.substr(b, e - b + 1); }
inline bool iequals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (tolower((unsigned char)a[i]) != tolower((unsigned char)b[i])) return false;
  return true; }
}}}
"""


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    cxx = compiler()
    out = {}
    for tag in S.TAGS:
        d = tmp_path_factory.mktemp(f"nccl{S.vstr(tag)}")
        (d / "param").mkdir()
        (d / "nccl.h").write_text("#pragma once\n")
        (d / "debug.h").write_text("#pragma once\n")
        (d / "param" / "utils.h").write_text(UTILS)
        if tag >= (2, 30, 7):
            for h in ("parser_common.h", "parser_enum.h", "parser_bitset.h"):
                shutil.copy(SRC / f"nccl-{S.vstr(tag)}" / "src/include/param" / h, d / "param" / h)
        (d / "h.cc").write_text(harness(tag))
        r = subprocess.run([cxx, "-std=c++17", "-O0", "-w", "-I", str(d), str(d / "h.cc"), "-o",
                            str(d / "h"), "-lpthread"], capture_output=True, text=True)
        assert r.returncode == 0, f"{S.vstr(tag)}: {r.stderr[-3000:]}"
        out[tag] = d / "h"
    return out


def run_c(binary, mode, values) -> list[str]:
    data = "".join(v.encode().hex() + "\n" for v in values)
    r = subprocess.run([str(binary), mode], input=data, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(values) and len(set(values)) >= 1000
    return lines


def rcase(rng, word):
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in word)


def distinct(make, n):
    """n different values from make() (a seeded generator), in generation order."""
    seen = {}
    for _ in range(50 * n):
        seen.setdefault(make(), None)
        if len(seen) == n:
            break
    assert len(seen) == n, f"generator gave only {len(seen)} distinct values"
    return list(seen)


def gen_lists(rng, names, prefixes, n):
    junk = ["", " ", "foo", "shm", "alltoall", "ring ", " tree", "PAT", "nvls_tree"]
    seps = [",", ",", ";", ":", "^", ",,", ";;", "::", " "]

    def make():
        parts = []
        for _ in range(rng.randint(0, 7)):
            r = rng.random()
            pool = names if r < 0.55 else prefixes if r < 0.75 else junk
            parts.append(rcase(rng, rng.choice(pool)))
            parts.append(rng.choice(seps))
        s = "".join(parts[:-1] if parts and rng.random() < 0.6 else parts)
        return ("^" + s) if rng.random() < 0.2 else s
    return distinct(make, n)


def gen_ints(rng, n):
    atoms = ["0", "1", "7", "8", "9", "32", "64", "96", "100", "0x", "0X", "ff", "1f", "-", "+",
             " ", "\t", "k", "M", "G", "08", "010", "9223372036854775807", "9223372036854775808",
             "99999999999999999999", "4294967360", "2147483648", "abc", "."]
    return distinct(lambda: "".join(rng.choice(atoms) for _ in range(rng.randint(0, 4))), n)


def gen_names(rng, names, n, sep=","):
    junk = ["", " ", "\t", "foo", "all", "Info ", " WARN", "alloc_host", "^"]

    def make():
        k = rng.randint(0, 4)
        items = [(rng.choice([" ", "", "\t"]) if rng.random() < 0.3 else "") +
                 rcase(rng, rng.choice(names if rng.random() < 0.75 else junk)) +
                 (rng.choice([" ", "\t"]) if rng.random() < 0.2 else "") for _ in range(k)]
        s = sep.join(items)
        return ("^" + s) if rng.random() < 0.2 else s
    return distinct(make, n)


@pytest.mark.parametrize("tag", S.TAGS, ids=S.vstr)
@pytest.mark.parametrize("var", ["algo", "proto"])
def test_parse_list_matches_c(binaries, tag, var):
    rng = random.Random(f"{SEED}{tag}{var}")
    elems = S.algorithms(tag) if var == "algo" else S.PROTOS
    values = gen_lists(rng, elems, [f.lower() for f in S.FUNCS], N)
    got = run_c(binaries[tag], var, values)
    bad = []
    for v, line in zip(values, got):
        if tag >= (2, 24, 3):
            start = [2 if var == "proto" and e == "LL128" else 1 for _ in S.FUNCS for e in elems]
            lst, problem = cmodel.parse_list_prefixed(v, S.FUNCS, elems, start)
            want = ("SIG11" if problem and problem[0] == "crash" else "5" if problem
                    else "0 " + " ".join(map(str, lst)))
        else:
            want = "0 " + " ".join(map(str, cmodel.parse_list_flat(v, elems)))
        if line != want:
            bad.append((v, line, want))
    assert not bad, bad[:5]


@pytest.mark.parametrize("tag", S.TAGS, ids=S.vstr)
def test_integer_params_match_c(binaries, tag):
    rng = random.Random(f"{SEED}{tag}int")
    values = gen_ints(rng, N)
    got = run_c(binaries[tag], "int", values)
    bad = [(v, g) for v, g in zip(values, got) if int(g) != cmodel.load_param(v, -2)]
    assert not bad, bad[:5]


@pytest.mark.parametrize("tag", S.TAGS, ids=S.vstr)
def test_get_nthreads_matches_c(binaries, tag):
    rng = random.Random(f"{SEED}{tag}nt")
    values = gen_ints(rng, N // 2)
    values += [v for v in distinct(lambda: str(rng.randint(-300, 3000)), N) if v not in values]
    got = run_c(binaries[tag], "nthreads", values)
    bad = []
    for v, g in zip(values, got):
        env = cmodel.to_int(cmodel.load_param(v, -2))
        want = f"{cmodel.get_nthreads(env, 64, 512, 256)} {cmodel.get_nthreads(env, 160, 640, 640)}"
        if g != want:
            bad.append((v, g, want))
    assert not bad, bad[:5]


@pytest.mark.parametrize("tag", S.TAGS, ids=S.vstr)
def test_debug_subsys_matches_c(binaries, tag):
    rng = random.Random(f"{SEED}{tag}subsys")
    values = gen_names(rng, S.debug_subsys(tag), N)
    got = run_c(binaries[tag], "subsys", values)
    opts = subsys_options(tag)
    bad = []
    for v, g in zip(values, got):
        if tag >= (2, 30, 7):
            m = cmodel.bitset30(v, opts)
            want = "X" if m is None else str(m)
        else:
            want = str(cmodel.debug_subsys_old(v, opts))
        if g != want:
            bad.append((v, g, want))
    assert not bad, bad[:5]


def test_debug_level_enum_2_30_matches_c(binaries):
    tag = (2, 30, 7)
    rng = random.Random(f"{SEED}level")
    values = gen_names(rng, S.debug_levels(tag), N, sep="")
    got = run_c(binaries[tag], "level", values)
    bad = []
    for v, g in zip(values, got):
        i = cmodel.one_of30(v, S.debug_levels(tag))
        if int(g) != (-1 if i is None else i + 1):
            bad.append((v, g))
    assert not bad, bad[:5]


@pytest.mark.parametrize("tag", [t for t in S.TAGS if t < (2, 30, 7)], ids=S.vstr)
@pytest.mark.parametrize("value,level", [
    # src/debug.cc (e.g. 2.27.7:49-61): strcasecmp on the whole value; no trimming
    ("INFO", 3), ("info", 3), ("Warn", 2), ("VERSION", 1), ("ABORT", 4), ("TRACE", 5),
    (" INFO", None), ("INFO ", None), ("", None), ("VERBOSE", None), ("INF", None)])
def test_debug_level_old_table(tag, value, level):
    """ncclDebugInit's level chain is not a separable function: a table with its source line."""
    text = need(SRC / f"nccl-{S.vstr(tag)}" / "src/debug.cc")
    assert re.findall(r'strcasecmp\(nccl_debug, "(\w+)"\)', text) == list(S.debug_levels(tag))
    i = cmodel.debug_level_old(value, S.debug_levels(tag))
    assert (None if i is None else i + 1) == level


@pytest.mark.parametrize("tag", S.TAGS, ids=S.vstr)
@pytest.mark.parametrize("value,want", [
    # src/graph/paths.cc ncclGetLevel: strcmp against the names (topoPathTypeStr is not among the
    # copies, so this is a table); first char a digit -> strtol, clamped, levelsOldToNew
    ("SYS", "SYS"), ("PHB", "PHB"), ("nvl", None), ("NVL ", None), ("", None), ("FAST", None),
    ("0", "LOC"), ("1", "PIX"), ("2", "PXB"), ("3", "PHB"), ("4", "SYS"), ("5", "SYS"),
    ("9", "SYS"), ("2x", "PXB"), ("08", "LOC"), (" 2", None), ("-1", None)])
def test_path_level_table(tag, value, want):
    names = S.path_levels(tag)
    got = cmodel.get_level(value, names, S.LEGACY_LEVELS)
    assert (names[got] if isinstance(got, int) else got) == want
