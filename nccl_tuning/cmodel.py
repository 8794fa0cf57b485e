"""Python models of NCCL's C string parsers, function by function (pure, torch-free).

Each function mirrors one C function of NCCL's code as read at each tag (file:line in the docstring,
"<tag>" meaning every tag read unless named). The C originals once compiled side by side agreed with
these models on all 40,744 generated inputs; that agreement is kept as recorded verdicts
(tests/data/nccl_verdicts.json, tests/test_nccl_cmodel.py), so a model that drifts from what NCCL's
code does fails there.
"""

from __future__ import annotations

C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def strtok(text: str, delims: str) -> list[tuple[int, str]]:
    """strtok/strtok_r: the non-empty pieces between delimiters, each with its start offset
    (leading and repeated delimiters are skipped; an empty string gives no piece)."""
    out, i, n = [], 0, len(text)
    while i < n:
        while i < n and text[i] in delims:
            i += 1
        if i >= n:
            break
        j = i
        while j < n and text[j] not in delims:
            j += 1
        out.append((i, text[i:j]))
        i = j + 1
    return out


def strcasecmp_eq(a: str, b: str) -> bool:
    """strcasecmp(a, b) == 0 in the C locale (ASCII letters only fold)."""
    return len(a) == len(b) and all(
        x == y or (x.isascii() and y.isascii() and x.lower() == y.lower()) for x, y in zip(a, b)
    )


def strtoll(text: str) -> tuple[int, int, bool]:
    """glibc strtoll(text, &end, 0) -> (value, end offset, ERANGE). Base 0: 0x/0X hex (only when a
    hex digit follows), leading 0 octal, else decimal; leading C whitespace and one sign allowed;
    no digits -> (0, 0, False); overflow -> clamped with ERANGE."""
    i, n = 0, len(text)
    while i < n and text[i] in C_SPACE:
        i += 1
    neg = False
    if i < n and text[i] in "+-":
        neg, i = text[i] == "-", i + 1
    if text[i : i + 2] in ("0x", "0X") and i + 2 < n and text[i + 2] in "0123456789abcdefABCDEF":
        base, i = 16, i + 2
        digits = "0123456789abcdefABCDEF"
    elif i < n and text[i] == "0":
        base, digits = 8, "01234567"
    else:
        base, digits = 10, "0123456789"
    j = i
    while j < n and text[j] in digits:
        j += 1
    if j == i:
        return 0, 0, False
    value = int(text[i:j], base)
    value = -value if neg else value
    if value > INT64_MAX:
        return INT64_MAX, j, True
    if value < INT64_MIN:
        return INT64_MIN, j, True
    return value, j, False


def load_param(text: str | None, default: int) -> int:
    """ncclLoadParam (src/misc/param.cc, every tag): unset or empty -> default; strtoll base 0,
    trailing characters ignored; errno (overflow) -> default."""
    if text is None or text == "":
        return default
    value, _, erange = strtoll(text)
    return default if erange else value


def to_int(value: int) -> int:
    """int64_t -> int as gcc converts it (modulo 2**32): NCCL stores most params in an int."""
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def get_nthreads(env: int, lo: int, hi: int, default: int, warp: int = 32) -> int:
    """getNthreads (src/graph/tuning.cc:15, 2.30.7:17): > 0 must be a multiple of the warp size
    (else max), above max -> max, below min -> min; <= 0 -> default."""
    if env > 0:
        if env % warp != 0:
            return hi
        if env > hi:
            return hi
        if env < lo:
            return lo
        return env
    return default


def parse_list_flat(value: str, elems) -> list[int]:
    """parseList up to 2.23 (src/graph/tuning.cc:34): '^' first -> unlisted 1, listed 0; else
    unlisted 0, listed 1; tokens by strtok(','), compared with strcasecmp; unknown ones ignored."""
    invert = value.startswith("^")
    body = value[1:] if invert else value
    out = [1 if invert else 0] * len(elems)
    for _, tok in strtok(body, ","):
        for i, e in enumerate(elems):
            if strcasecmp_eq(tok, e):
                out[i] = 0 if invert else 1
    return out


def parse_list_prefixed(value: str, prefixes, elems, start: list[int]):
    """parseList since 2.24 (2.24.3 src/graph/tuning.cc:53): entries by strtok(';'); each entry
    split by strtok(':') into prefix and list (no list -> the prefix is the list, allowed only when
    the entry starts the string); '^' -> listed 0, others 1. Returns (list, problem) where problem
    is None or (kind, token): kind 'first-prefix' | 'element' | 'prefix' (init fails) | 'crash'
    (the first entry has only ':' characters: NCCL reads elemList[0] through a NULL pointer)."""
    out = list(start)
    nel = len(elems)
    for pos, entry in strtok(value, ";"):
        parts = strtok(entry, ":")
        prefix = parts[0][1] if parts else None
        elem_list = parts[1][1] if len(parts) > 1 else None
        if elem_list is None:
            if pos != 0:
                return out, ("first-prefix", entry)
            elem_list, prefix = prefix, None
        if elem_list is None:  # first entry made only of ':': elemList[0] on NULL
            return out, ("crash", entry)
        unset = elem_list.startswith("^")
        if unset:
            elem_list = elem_list[1:]
        found = False
        for p, name in enumerate(prefixes):
            if prefix is not None and not strcasecmp_eq(prefix, name):
                continue
            found = True
            for e in range(nel):
                out[p * nel + e] = 1 if unset else 0
            for _, tok in strtok(elem_list, ","):
                hit = [e for e in range(nel) if strcasecmp_eq(tok, elems[e])]
                if not hit:
                    return out, ("element", tok)
                out[p * nel + hit[0]] = 0 if unset else 1
        if not found:
            return out, ("prefix", prefix)
    return out, None


def trim30(text: str) -> str:
    """nccl::param::utils::trim (2.30.7; utils.h was not read): assumed to strip C
    whitespace at both ends. The differential harness used the same definition."""
    return text.strip(C_SPACE)


def iequals30(a: str, b: str) -> bool:
    """nccl::param::utils::iequals (2.30.7, not read): ASCII case-insensitive equality."""
    return strcasecmp_eq(a, b)


def one_of30(value: str, names) -> int | None:
    """oneOfResolve (2.30.7 src/include/param/parser_enum.h:18): trimmed, case-insensitive, the
    first matching option; empty or unknown -> None (ncclInvalidArgument)."""
    token = trim30(value)
    if not token:
        return None
    for i, name in enumerate(names):
        if iequals30(name, token):
            return i
    return None


def bitset30(value: str, options, width: int = 64) -> int | None:
    """bitsetResolve (2.30.7 src/include/param/parser_bitset.h:24): optional leading '^' inverts;
    pieces split on ',' (empty pieces kept and skipped), each trimmed; one unknown piece rejects the
    whole value (None). options: [(name, mask)]."""
    full = (1 << width) - 1
    invert = value.startswith("^")
    body = value[1:] if invert else value
    res = full if invert else 0
    for piece in body.split(","):
        token = trim30(piece)
        if not token:
            continue
        hit = [m for n, m in options if iequals30(n, token)]
        if not hit:
            return None
        res = res & ~hit[0] & full if invert else res | hit[0]
    return res


def debug_subsys_old(value: str, options, width: int = 64) -> int:
    """The NCCL_DEBUG_SUBSYS loop of ncclDebugInit up to 2.27 (src/debug.cc, e.g. 2.27.7:67-110):
    '^' inverts, strtok(','), strcasecmp; unknown names are skipped silently."""
    full = (1 << width) - 1
    invert = value.startswith("^")
    body = value[1:] if invert else value
    mask = full if invert else 0
    for _, tok in strtok(body, ","):
        hit = [m for n, m in options if strcasecmp_eq(tok, n)]
        if hit and hit[0]:
            mask = mask & ~hit[0] & full if invert else mask | hit[0]
    return mask


def debug_level_old(value: str | None, names) -> int | None:
    """NCCL_DEBUG up to 2.27 (src/debug.cc, e.g. 2.18.6:28-42): unset -> NONE (returned as -1 ...
    here None means 'no level matched': NCCL keeps level -1, prints nothing and re-reads the
    variable at every log call)."""
    if value is None:
        return -1
    for i, name in enumerate(names):
        if strcasecmp_eq(value, name):
            return i
    return None


def get_level(value: str, names, old_levels) -> int | None:
    """ncclGetLevel's level part (src/graph/paths.cc, e.g. 2.30.7:256-272): exact strcmp against
    the path names up to SYS; else, when the first char is a digit, strtol(base 0) clamped to the
    legacy table; else None (NCCL ignores it and keeps its automatic choice)."""
    for i, name in enumerate(names):
        if value == name:
            return i
    if value[:1] in tuple("0123456789"):
        old, _, _ = strtoll(value)
        old = min(to_int(old), len(old_levels) - 1)  # strtol -> int oldLevel, clamped
        return old_levels[old] if old >= 0 else None  # (a wrapped negative index is UB in C)
    return None


# ---- NCCL_SOCKET_IFNAME / NCCL_IB_HCA: parseStringList, matchIfList and the readers' prefixes ----


def atoi(text: str) -> int:
    """glibc atoi: (int) strtol(text, NULL, 10): leading C whitespace, one sign, decimal digits;
    no digits -> 0; a long overflow clamps, then the int conversion wraps."""
    i, n = 0, len(text)
    while i < n and text[i] in C_SPACE:
        i += 1
    sign = -1 if i < n and text[i] == "-" else 1
    if i < n and text[i] in "+-":
        i += 1
    j = i
    while j < n and text[j] in "0123456789":
        j += 1
    if j == i:
        return 0
    value = max(INT64_MIN, min(INT64_MAX, sign * int(text[i:j])))
    return to_int(value)


def parse_string_list_scan(value: str, max_list: int) -> list[tuple[str, int]]:
    """parseStringList up to 2.27.7 (src/misc/utils.cc:137, 2.23.4-2.27.7:135), a character scanner:
    ',' ends an entry, ':' ends its name and the port is atoi() of what follows (so 'x:' gives port
    0), then everything up to the next ',' is skipped; an entry with no name is dropped; no ':' ->
    port -1 (any); stops after max_list entries. A name over 63 characters overruns NCCL's 64-byte
    buffer (undefined): it is kept whole here and the checks flag it."""
    out, name, i, n = [], "", 0, len(value)
    while True:
        c = value[i] if i < n else ""
        if c == ":":
            if name:
                out.append((name, atoi(value[i + 1 :])))
                name = ""
            while i < n and value[i] != ",":
                i += 1
            c = value[i] if i < n else ""
        elif c in (",", ""):
            if name:
                out.append((name, -1))
                name = ""
        else:
            name += c
        i += 1
        if len(out) >= max_list or c == "":
            return out


def parse_string_list_tok(value: str, max_list: int) -> list[tuple[str, int]]:
    """parseStringList in 2.30.7 (src/misc/utils.cc:189): entries by strtok(','), each split by
    strsep(':') into name, port, rail, plane; an empty name drops the entry; an empty or absent port
    is -1 (any); the name is cut to 63 characters (snprintf into prefix[64]); stops after max_list
    entries. -> [(name, port)] (rail and plane do not select anything)."""
    out = []
    for _, entry in strtok(value, ","):
        if len(out) >= max_list:
            break
        parts = entry.split(":")
        if not parts[0]:
            continue
        port = atoi(parts[1]) if len(parts) > 1 and parts[1] else -1
        out.append((parts[0][:63], port))
    return out


def match_if(name: str, ref: str, exact: bool) -> bool:
    """matchIf (src/misc/utils.cc:171, 2.23.4-2.27.7:169, 2.30.7:220): exact -> strncmp over
    strlen(name)+1, i.e. equal; else strncmp over strlen(ref): ref is a prefix of name
    (case-sensitive)."""
    return name == ref if exact else name.startswith(ref)


def match_port(port1: int, port2: int) -> bool:
    """matchPort (utils.cc:175): -1 on either side matches any port, else they must be equal."""
    return port1 == -1 or port2 == -1 or port1 == port2


def match_if_list(name: str, port: int, entries, exact: bool) -> bool:
    """matchIfList (utils.cc:183, 2.23.4-2.27.7:181, 2.30.7:231): an empty list matches everything;
    else some entry must match both name (match_if) and port (match_port)."""
    if not entries:
        return True
    return any(match_if(name, ref, exact) and match_port(port, p) for ref, p in entries)


def if_selector(value: str, max_list: int, parser: str) -> tuple[bool, bool, list]:
    """The readers' prefixes (findInterfaces in src/misc/socket.cc, 2.30.7 src/os/linux.cc;
    ncclIbInit in src/transport/net_ib.cc, 2.30.7 net_ib/init.cc): a leading '^' excludes
    (searchNot), then a leading '=' makes names exact (searchExact); the rest is parseStringList's.
    -> (excluded, exact, [(name, port)])."""
    excluded = value.startswith("^")
    rest = value[1:] if excluded else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    parse = parse_string_list_tok if parser == "tok" else parse_string_list_scan
    return excluded, exact, parse(rest, max_list)


def if_selects(selector, name: str, port: int = -1) -> bool:
    """The readers' test: matchIfList(name, port, list, exact) ^ searchNot (socket interfaces are
    matched with port -1; IB devices with each port number from 1)."""
    excluded, exact, entries = selector
    return match_if_list(name, port, entries, exact) != excluded
