"""NCCL facts as data: variable names, removed names, classes, PyTorch names, name version gates,
documented value ranges for the variables whose reading code was not among the NCCL files read.

Sources: the data files in nccl_tuning/data/ (names gathered from NCCL 2.30.7's code and its env
docs: every NCCL_* name read, removed names, the "Debugging" and "System configuration" classes).
Everything NCCL's parsers decide (NCCL_ALGO/PROTO, integers, NCCL_NTHREADS, channels, BUFFSIZE,
NCCL_DEBUG/_SUBSYS, path levels) was read from NCCL's code per tag (NVIDIA/nccl at each tag): see
ncclsrc.py (facts with file:line), cmodel.py (the C parsers in Python) and srcchecks.py. The version
gates in NAME_SINCE were not read from the code: they come from NCCL release notes as remembered,
and a name without a known gate is assumed to exist in every version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from .errors import NcclTuningError

NEWEST = (2, 30, 7)  # the version the name list was taken from


def _lines(name: str) -> list[str]:
    text = resources.files(__package__).joinpath("data", name).read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


NAMES = frozenset(_lines("nccl_env_names_2.30.7.txt"))  # all read by NCCL 2.30.7
REMOVED = frozenset(_lines("nccl_env_removed.txt"))  # ignored by current NCCL
DEBUGGING_CLASS = frozenset(_lines("env_debugging_section.txt"))  # "use with caution" class

# Removed names -> what replaced them.
REPLACEMENTS = {
    "NCCL_CHECKS_DISABLE": "NCCL_CHECK_POINTERS",
    "NCCL_IB_CUDA_SUPPORT": "NCCL_NET_GDR_LEVEL",
    "NCCL_IB_GDR_LEVEL": "NCCL_NET_GDR_LEVEL",
    "NCCL_LL_THRESHOLD": "NCCL_PROTO (the tuning model picks LL by size)",
    "NCCL_TREE_THRESHOLD": "NCCL_ALGO (the tuning model picks Tree by size)",
    "NCCL_SINGLE_RING_THRESHOLD": "nothing (the tuning model picks the channel count)",
}

# Names that look like NCCL's but that NCCL never reads. value: (who reads it, what to use instead)
NOT_NCCL = {
    "NCCL_TIMEOUT": (
        "nobody (a script convention)",
        "the timeout= argument of torch.distributed.init_process_group",
    ),
    "NCCL_BLOCKING_WAIT": ("PyTorch (deprecated name)", "TORCH_NCCL_BLOCKING_WAIT"),
    "NCCL_ASYNC_ERROR_HANDLING": ("PyTorch (deprecated name)", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    "NCCL_DESYNC_DEBUG": ("PyTorch (deprecated name)", "TORCH_NCCL_DESYNC_DEBUG"),
    "NCCL_ENABLE_TIMING": ("PyTorch (deprecated name)", "TORCH_NCCL_ENABLE_TIMING"),
    "NCCL_AVOID_RECORD_STREAMS": ("PyTorch (deprecated name)", "TORCH_NCCL_AVOID_RECORD_STREAMS"),
    "NCCL_TRACE_BUFFER_SIZE": ("nobody", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    "NCCL_ENABLE": ("nobody", "the dist backend choice (--dist-backend nccl)"),
    "NCCL_DISABLE": ("nobody", "the dist backend choice (--dist-backend gloo)"),
    "NCCL_SHM_ENABLE": ("nobody", "NCCL_SHM_DISABLE=0 (the default)"),
    "NCCL_P2P_ENABLE": ("nobody", "NCCL_P2P_DISABLE=0 (the default)"),
    "NCCL_IB_ENABLE": ("nobody", "NCCL_IB_DISABLE=0 (the default)"),
}

# PyTorch's own NCCL-related variables (not NCCL's); checked lightly.
TORCH_NAMES = frozenset(
    {
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
        "TORCH_NCCL_BLOCKING_WAIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_DESYNC_DEBUG",
        "TORCH_NCCL_ENABLE_TIMING",
        "TORCH_NCCL_AVOID_RECORD_STREAMS",
        "TORCH_NCCL_USE_COMM_NONBLOCKING",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
        "TORCH_NCCL_ENABLE_MONITORING",
        "TORCH_NCCL_TRACE_CPP_STACK",
        "TORCH_NCCL_COORD_CHECK_MILSEC",
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC",
        "TORCH_NCCL_HIGH_PRIORITY",
        "TORCH_NCCL_NAN_CHECK",
        "TORCH_NCCL_PROPAGATE_ERROR",
        "TORCH_NCCL_CUDA_EVENT_CACHE",
        "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN",
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_DISTRIBUTED_DEBUG",
    }
)

# Names added after NCCL 2.12 (first version that reads them; release notes, as remembered).
NAME_SINCE = {
    "NCCL_NVLS_ENABLE": (2, 17, 0),
    "NCCL_NVLS_NCHANNELS": (2, 17, 0),
    "NCCL_CUMEM_ENABLE": (2, 18, 0),
    "NCCL_NVLSTREE_MAX_CHUNKSIZE": (2, 18, 0),
    "NCCL_CUMEM_HOST_ENABLE": (2, 23, 0),
    "NCCL_PAT_ENABLE": (2, 23, 0),
    "NCCL_MNNVL_ENABLE": (2, 21, 0),
    "NCCL_MNNVL_UUID": (2, 21, 0),
    "NCCL_MNNVL_CLIQUE_ID": (2, 21, 0),
    "NCCL_RAS_ENABLE": (2, 24, 0),
    "NCCL_RAS_ADDR": (2, 24, 0),
    "NCCL_RAS_TIMEOUT_FACTOR": (2, 24, 0),
    "NCCL_IB_MERGE_NICS": (2, 20, 0),
    "NCCL_DEBUG_TIMESTAMP_FORMAT": (2, 26, 0),
    "NCCL_DEBUG_TIMESTAMP_LEVELS": (2, 26, 0),
    "NCCL_SYM_KERNEL": (2, 27, 0),
    "NCCL_SYM_CTAS": (2, 27, 0),
    "NCCL_WIN_ENABLE": (2, 27, 0),
    "NCCL_GIN_ENABLE": (2, 28, 0),
    "NCCL_GIN_TYPE": (2, 28, 0),
    "NCCL_CTA_POLICY": (2, 27, 0),
    "NCCL_NETDEVS_POLICY": (2, 28, 0),
    "NCCL_ENV_PLUGIN": (2, 28, 0),
    "NCCL_PROFILER_PLUGIN": (2, 21, 0),
    "NCCL_TUNER_PLUGIN": (2, 19, 0),
    "NCCL_P2P_NET_CHUNKSIZE": (2, 14, 0),
    "NCCL_P2P_NVL_CHUNKSIZE": (2, 14, 0),
    "NCCL_P2P_PCI_CHUNKSIZE": (2, 14, 0),
    "NCCL_RUNTIME_CONNECT": (2, 22, 0),
    "NCCL_LOCAL_REGISTER": (2, 19, 0),
    "NCCL_IB_ECE_ENABLE": (2, 23, 0),
}


@dataclass(frozen=True)
class Spec:
    """How NCCL reads one variable.  kind: int | bool | enum | level | str"""

    kind: str
    lo: int | None = None
    hi: int | None = None
    default: int | str | None = None  # NCCL's default, when it is one fixed value
    choices: tuple = ()  # allowed ints (kind int) or strings (kind enum)
    pow2: bool = False  # NCCL recommends a power of two
    case_sensitive: bool = True  # for enums
    unit: str = ""


def _b(default=0):
    return Spec("bool", 0, 1, default)


SPECS: dict[str, Spec] = {
    **{
        n: _b(0)
        for n in (
            "NCCL_P2P_DISABLE",
            "NCCL_SHM_DISABLE",
            "NCCL_IB_DISABLE",
            "NCCL_P2P_DIRECT_DISABLE",
            "NCCL_PXN_DISABLE",
            "NCCL_NVB_DISABLE",
            "NCCL_CHECK_POINTERS",
            "NCCL_IGNORE_CPU_AFFINITY",
            "NCCL_NVTX_DISABLE",
            "NCCL_IGNORE_DISABLED_P2P",
        )
    },
    **{
        n: _b(None)
        for n in (
            "NCCL_CUMEM_ENABLE",
            "NCCL_CUMEM_HOST_ENABLE",
            "NCCL_COLLNET_ENABLE",
            "NCCL_NET_GDR_READ",
            "NCCL_COMM_BLOCKING",
            "NCCL_RUNTIME_CONNECT",
            "NCCL_GRAPH_REGISTER",
            "NCCL_LOCAL_REGISTER",
            "NCCL_DMABUF_ENABLE",
            "NCCL_IB_ADAPTIVE_ROUTING",
            "NCCL_IB_ECE_ENABLE",
            "NCCL_NET_SHARED_COMMS",
            "NCCL_NET_SHARED_BUFFERS",
            "NCCL_PAT_ENABLE",
            "NCCL_RAS_ENABLE",
            "NCCL_SET_THREAD_NAME",
            "NCCL_IB_SPLIT_DATA_ON_QPS",
            "NCCL_IB_OOO_RQ",
            "NCCL_GRAPH_MIXING_SUPPORT",
            "NCCL_IB_RETURN_ASYNC_EVENTS",
            "NCCL_OOB_NET_ENABLE",
            "NCCL_IB_MERGE_NICS",
            "NCCL_PXN_C2C",
            "NCCL_NET_GDR_C2C",
            "NCCL_LEGACY_CUDA_REGISTER",
            "NCCL_WIN_ENABLE",
        )
    },
    "NCCL_NVLS_ENABLE": Spec("int", 0, 2),
    "NCCL_MNNVL_ENABLE": Spec("int", 0, 2),
    "NCCL_IB_PCI_RELAXED_ORDERING": Spec("int", 0, 2),
    "NCCL_CROSS_NIC": Spec("int", 0, 2, default=2),
    "NCCL_P2P_PXN_LEVEL": Spec("int", 0, 2),
    "NCCL_MIN_CTAS": Spec("int", 1, 64),
    "NCCL_MAX_CTAS": Spec("int", 1, 64),
    "NCCL_IB_QPS_PER_CONNECTION": Spec("int", 1, 128, default=1),
    "NCCL_IB_TIMEOUT": Spec("int", 1, 31),
    "NCCL_IB_RETRY_CNT": Spec("int", 0, 7, default=7),
    "NCCL_IB_SL": Spec("int", 0, 15),
    "NCCL_IB_TC": Spec("int", 0, 255),
    "NCCL_IB_FIFO_TC": Spec("int", 0, 255),
    "NCCL_IB_GID_INDEX": Spec("int", -1, 255),
    "NCCL_IB_ROCE_VERSION_NUM": Spec("int", 1, 2, default=2),
    "NCCL_IB_AR_THRESHOLD": Spec("int", 0, None, unit="bytes"),
    "NCCL_SOCKET_NTHREADS": Spec("int", 1, 16),
    "NCCL_NSOCKS_PERTHREAD": Spec("int", 1, 64),
    "NCCL_CGA_CLUSTER_SIZE": Spec("int", 0, 8),
    "NCCL_COLLNET_NODE_THRESHOLD": Spec("int", 1, None),
    "NCCL_LAUNCH_MODE": Spec("enum", choices=("PARALLEL", "GROUP")),
    "NCCL_SOCKET_FAMILY": Spec("enum", choices=("AF_INET", "AF_INET6")),
    "NCCL_IB_ADDR_FAMILY": Spec("enum", choices=("AF_INET", "AF_INET6")),
}

# Values of NCCL_NET that NCCL itself provides (anything else names a plugin).
BUILTIN_NETS = ("IB", "Socket")


def parse_version(text: str) -> tuple[int, int, int]:
    """'2.21', '2.21.5', '2.21.5-1' -> (2, 21, 5); anything else is an NcclTuningError."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.(\d+))?(?:-\d+)?\s*", str(text))
    if not m:
        raise NcclTuningError(
            f"NCCL version {text!r} is not a version; expected e.g. 2.21 or 2.21.5"
        )
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def vstr(v: tuple) -> str:
    return ".".join(str(x) for x in v)


@dataclass(frozen=True)
class IntParse:
    """Result of C strtoll(s, &end, 0): value, what was consumed, what was left, overflow."""

    value: int
    rest: str
    digits: bool
    overflow: bool


_INT_RE = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX](?=[0-9a-fA-F])[0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def parse_int(text: str) -> IntParse:
    """Mirror strtoll(text, &end, 0): '010' -> 8, '0x10' -> 16, '4M' -> 4 (rest 'M'), 'x' -> 0."""
    m = _INT_RE.match(text)
    if not m:
        return IntParse(0, text, False, False)
    sign, body = m.group(1), m.group(2)
    if body[:2] in ("0x", "0X"):
        value = int(body[2:], 16)
    elif body.startswith("0"):
        value = int(body, 8)
    else:
        value = int(body)
    value = -value if sign == "-" else value
    overflow = not (-(2**63) <= value < 2**63)
    return IntParse(value, text[m.end() :], True, overflow)


def installed_nccl_version() -> tuple[int, int, int] | None:
    """The NCCL that pip installed next to torch (nvidia-nccl-cu*), read without importing torch."""
    from importlib import metadata

    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            return parse_version(metadata.version(dist).split("+")[0])
        except (metadata.PackageNotFoundError, NcclTuningError):
            continue
    return None
