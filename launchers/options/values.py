"""One parser for each kind of value, used alike by the flags, the LAUNCH_* defaults, profiles and
the Python API.

An integer is plain ASCII decimal everywhere: `12`, `0`, `-1` -- never `010`, `0x10`, `1_0`, `+2`, `
2` or full-width digits. A number (seconds) is the same with an optional fraction and exponent:
`30`, `2.5`, `1e-05`. A profile is read by ProfileLoader: YAML's safe subset, but a scalar YAML 1.1
would read as a number (`010` is 8 there, `0x10` 16, `04:00:00` 14400) is kept as its text (Number)
for these parsers to read, a date or time (`2001-12-14`) stays its text, a key given twice in one
mapping is an error, and so are more than MAX_NODES values once aliases (`*a`) are expanded (an
alias bomb) and a file over MAX_YAML_BYTES (read no further). Stdlib only (yaml is imported by
profile_loader(), when a profile is read).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import LaunchError, brief

INT_TEXT = re.compile(r"0|-?[1-9][0-9]*")
NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
MAX_DIGITS = 30
INT_WORDS = "an integer in plain decimal digits"
NUMBER_WORDS = "a number in plain decimal digits"
# what launch sets in every worker's environment, and the flag (or the part of launch) that sets
# each: `--env NAME=...` for one of these would be replaced without a word, so it is refused
RESERVED_ENV = {
    "MASTER_ADDR": "the first node (--hosts / --hostfile; Slurm: the first allocated node)",
    "MASTER_PORT": "--master-port",
    "NNODES": "--nodes",
    "NODE_RANK": "launch (each node's rank)",
    "LAUNCH_NODE_SLOT": "launch (each node's slot: --spares)",
    "LAUNCH_MEMORY_CHECKPOINT": "--memory-checkpoint-every",
    "LAUNCH_MEMORY_CHECKPOINT_DIR": "--memory-checkpoint",
    "WORLD_SIZE": "--nodes and --gpus-per-node (torchrun)",
    "RANK": "--nodes and --gpus-per-node (torchrun)",
    "LOCAL_RANK": "--gpus-per-node (torchrun)",
    "LOCAL_WORLD_SIZE": "--gpus-per-node (torchrun)",
    "GROUP_RANK": "launch (each node's rank, torchrun)",
    "LAUNCH_RUN_DIR": "--run-dir",
    "LAUNCH_RUN_ID": "--run-dir",
    "LAUNCH_CHECKPOINT_DIR": "--run-dir",
    "LAUNCH_ATTEMPT": "launch resume",
    "LAUNCH_DIST_BACKEND": "--dist-backend",
    "LAUNCH_STOP_GRACE": "--stop-grace",
    "PET_SHUTDOWN_TIMEOUT": "--stop-grace",
    "LAUNCH_STOP_SIGNAL": "--stop-signal",
    "LAUNCH_HANG_TIMEOUT": "--hang-timeout",
    "PYTHONUNBUFFERED": "launch (always 1)",
    "LAUNCH_CPU_BIND": "--cpu-bind",
    "LAUNCH_CPU_BIND_SLOT": "--cpu-bind (the local backend: each node's slots)",
    "LAUNCH_SNAPSHOT_DIR": "--snapshot",
    "LAUNCH_TORCH_EXTENSIONS_DIR": "launch (its TORCH_EXTENSIONS_DIR)",
    "LAUNCH_PRIVATE_ENV": "--secret NAME (launch lists the job's secret names there)",
}


class Number(str):
    """A profile scalar YAML 1.1 would have read as a number, kept as the text written in the
    file."""


def parse_int(what: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """The one integer parser: text (a flag, a LAUNCH_* variable, a profile's Number) or an int (the
    API)."""
    if minimum is None:
        accepted = INT_WORDS
    elif maximum is None:
        accepted = f"an integer >= {minimum} in plain decimal digits"
    else:
        accepted = f"an integer {minimum}-{maximum} in plain decimal digits"
    text = value if isinstance(value, str) else str(value) if type(value) is int else None
    if text is None or not INT_TEXT.fullmatch(text):
        raise LaunchError(f"{what} {brief(value)} is not accepted; give {accepted}")
    n = int(text, 10) if len(text) <= MAX_DIGITS else None
    if n is None or (minimum is not None and n < minimum) or (maximum is not None and n > maximum):
        raise LaunchError(f"{what} {brief(value)} is out of range; give {accepted}")
    return n


def parse_number(what: str, value: Any, accepted: str = NUMBER_WORDS) -> float:
    """The one parser of a number (seconds): text or an int/float (the API); finite."""
    text = value if isinstance(value, str) else str(value) if type(value) in (int, float) else None
    if text is None or not NUMBER_TEXT.fullmatch(text) or len(text) > 60:
        raise LaunchError(f"{what} {brief(value)} is not accepted; give {accepted}")
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise LaunchError(f"{what} {brief(value)} is out of range; give {accepted}")
    return v


ENV_REFUSED = (("\0", "a NUL byte"), ("\n", "a newline"))


def check_env_value(what: str, name: str, value: str) -> str:
    """A worker's environment value holds no NUL byte (it cannot) and no newline (issue 21 item 7:
    refused on flags, profiles and the API alike); launch's own variables are not the user's to
    set."""
    bad = next((word for char, word in ENV_REFUSED if char in value), None)
    if bad:
        raise LaunchError(
            f"{what} {name}={brief(value)} holds {bad}; NUL and newline are not accepted in an "
            "environment value"
        )
    if name in RESERVED_ENV:
        raise LaunchError(
            f"{what} {name} is set by launch for every worker; give it with {RESERVED_ENV[name]} "
            "instead"
        )
    return value


MAX_YAML_BYTES = 1024 * 1024  # a profile or clusters file: at most 1 MiB
MAX_NODES = 100_000  # values in one YAML file, each alias (`*name`) counted as what it stands for


class TooMany(Exception):
    """A YAML file of more than MAX_NODES values once its aliases are expanded (an alias bomb)."""


def expanded_size(node: Any, seen: dict[int, int] | None = None) -> int:
    """How many values a composed YAML node stands for, an alias counted as often as it is used;
    stops counting past MAX_NODES (TooMany). A node met again (an alias) is counted from its first
    count."""
    seen = {} if seen is None else seen
    if id(node) in seen:
        return seen[id(node)]
    seen[id(node)] = 1
    value = node.value if isinstance(node.value, list) else []
    n = 1 + sum(
        expanded_size(x, seen)
        for item in value
        for x in (item if isinstance(item, tuple) else (item,))
    )
    if n > MAX_NODES:
        raise TooMany()
    seen[id(node)] = n
    return n


class DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, again: int):
        super().__init__(key, first, again)
        self.key, self.first, self.again = key, first, again


def profile_loader() -> type:
    """yaml.SafeLoader, but numbers kept as their text (Number) and a key given twice refused
    (DuplicateKey)."""
    import yaml

    class ProfileLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if (
                        not isinstance(key_node, yaml.ScalarNode)
                        or key_node.tag == "tag:yaml.org,2002:merge"
                    ):
                        continue
                    key, line = self.construct_object(key_node), key_node.start_mark.line + 1
                    if key in seen:
                        raise DuplicateKey(key, seen[key], line)
                    seen[key] = line
            return super().construct_mapping(node, deep)

    def number(loader, node):
        return Number(loader.construct_scalar(node))

    ProfileLoader.add_constructor("tag:yaml.org,2002:int", number)
    ProfileLoader.add_constructor("tag:yaml.org,2002:float", number)
    ProfileLoader.add_constructor(
        "tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node)
    )
    return ProfileLoader


def read_profile_yaml(stream: Any) -> Any:
    """One YAML document read by ProfileLoader (a yaml.SafeLoader: no python tags), as
    yaml.safe_load would."""
    loader = profile_loader()(stream)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml_file(path: str, what: str, expected: str, missing: str = "") -> Any:
    """A YAML file read by read_profile_yaml (a profile, the clusters file), every failure one
    LaunchError naming `what` and the path: absent (+ `missing`), not UTF-8, unreadable, a key given
    twice, not YAML."""
    import yaml

    limit = f"at most {MAX_YAML_BYTES // 1024 // 1024} MiB"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)  # never the whole of a huge file
        if len(data) > MAX_YAML_BYTES:
            raise LaunchError(
                f"{what} {path!r} is over the size limit ({limit}); expected {expected} of {limit}"
            )
        return read_profile_yaml(data.decode("utf-8"))
    except TooMany:
        raise LaunchError(
            f"{what} {path!r} stands for more than {MAX_NODES} values once its YAML aliases "
            f"(*name) are expanded (an alias bomb); expected {expected} of fewer values"
        ) from None
    except RecursionError:
        raise LaunchError(f"{what} {path!r} is nested too deep; expected {expected}") from None
    except FileNotFoundError:
        raise LaunchError(f"{what} {path!r} does not exist{missing}") from None
    except UnicodeDecodeError as e:
        raise LaunchError(
            f"{what} {path!r} is not UTF-8 (byte {e.start}); expected {expected}"
        ) from None
    except OSError as e:
        raise LaunchError(
            f"{what} {path!r} cannot be read ({e.strerror}); expected a file: {expected}"
        ) from None
    except DuplicateKey as e:
        raise LaunchError(
            f"{what} {path!r}: key {brief(plain(e.key))} is given twice (lines {e.first} and "
            f"{e.again}); give each key once"
        ) from None
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0]
        raise LaunchError(
            f"{what} {path!r} is not valid YAML (safe subset only): {first}"
        ) from None


def plain(value: Any) -> Any:
    """A profile's data with every Number turned into a plain str (what a flag's text would be)."""
    if isinstance(value, Number):
        return str(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
