"""The clusters file: Slurm clusters reached over SSH through their login node (`launch slurm
--cluster NAME`, profile `slurm: {cluster: NAME}`, and the other verbs' --cluster; issue 25 item 1).
The verbs run there by the cluster's own `launch` (launchers.ssh.viacluster over
launchers.ssh.clusterssh).

`$XDG_CONFIG_HOME/launchers/clusters.yaml` (default ~/.config/launchers/clusters.yaml;
LAUNCH_CLUSTERS_FILE names another), a mapping NAME -> its login node:

    dev:
      login: login1.example.org      # host name or ssh config alias (required)
      port: 22                       # default: the ssh config's Port, else 22
      user: alice                    # default: the ssh config's User, else yours
      identity: ~/.ssh/id_ed25519    # private key (default: ssh config / agent)
      jump: [bastion.example.org:2222, bob@gw2]   # jump host(s), first hop first: [user@]host[:port]
      known_hosts: ~/.ssh/known_hosts_clusters    # host keys of the login node and the jumps (unknown: refused)
      ssh_config: ~/.ssh/config      # resolves the names (HostName, Port, User, ...)
      runs_root: /shared/alice/runs  # run dirs on the cluster's shared storage (required, absolute)
      launch: /opt/launchers/bin/launch   # the `launch` command on the login node (default: launch on its PATH);
                                     # shell words, e.g. `env PYTHONPATH=/opt/src /opt/venv/bin/launch`

identity, known_hosts and ssh_config are files on this machine: `~` is expanded, a relative path is
relative to the clusters file. Pure apart from reading the file (no network). Every bad value is one
line naming the file, the cluster and the key, and what is accepted; unknown keys are refused.
"""  # noqa: E501

from __future__ import annotations

import os
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

from ..errors import LaunchError, brief
from ..options.values import INT_TEXT, read_yaml_file
from .hostfile import HostEntry, parse_host_word

ENV_FILE = "LAUNCH_CLUSTERS_FILE"
REQUIRED = ("login", "runs_root")
KEYS = (
    "login",
    "port",
    "user",
    "identity",
    "jump",
    "known_hosts",
    "ssh_config",
    "runs_root",
    "launch",
)
# paths on this machine (~ and relative: the file's dir)
LOCAL_FILES = ("identity", "known_hosts", "ssh_config")
RESERVED = ("all",)  # `launch list --cluster all`: every cluster
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}$")
SHAPE = (
    "a YAML mapping NAME: {login: HOST, runs_root: /PATH, port, user, identity, jump, known_hosts, "
    "ssh_config, launch}"
)


@dataclass(frozen=True)
class Cluster:
    name: str
    login: str  # host name or ssh config alias
    runs_root: str  # absolute POSIX path on the cluster
    port: int | None = None
    user: str | None = None
    identity: str | None = None  # local paths, ~ expanded
    jump: tuple[HostEntry, ...] = ()  # first hop first
    known_hosts: str | None = None
    ssh_config: str | None = None
    launch: str = "launch"  # the login node's `launch` command (shell words, checked by shlex)
    source: str = ""  # the clusters file it came from

    @property
    def login_entry(self) -> HostEntry:
        word = (
            (f"{self.user}@" if self.user else "")
            + self.login
            + (f":{self.port}" if self.port else "")
        )
        return HostEntry(word=word, name=self.login, user=self.user, port=self.port)

    @property
    def route(self) -> str:
        """`alice@login1:2222 via bastion:22` -- what the dry-run and the messages name."""
        via = f" via {', '.join(j.word for j in self.jump)}" if self.jump else ""
        return f"{self.login_entry.word}{via}"

    def run_dir(self, local_run_dir: str) -> str:
        """A run dir on the cluster: kept when already under the runs root, else its name under the
        runs root."""
        if local_run_dir == self.runs_root or local_run_dir.startswith(
            self.runs_root.rstrip("/") + "/"
        ):
            return local_run_dir
        return posixpath.join(self.runs_root, os.path.basename(local_run_dir.rstrip("/")))


def default_path() -> str:
    """LAUNCH_CLUSTERS_FILE, else $XDG_CONFIG_HOME/launchers/clusters.yaml (~/.config when
    unset)."""
    if os.environ.get(ENV_FILE):
        return os.path.abspath(os.path.expanduser(os.environ[ENV_FILE]))
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "launchers", "clusters.yaml")


def check_private(path: str) -> None:
    """The clusters file says which commands run where (launch_command, ProxyJump): refused when
    another user could write it -- owned by someone else (not root), group- or world-writable, or in
    a directory others can write (not sticky). A missing file is read_yaml_file's to name."""
    import stat

    try:
        st, parent = os.stat(path), os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return
    mine = (os.getuid(), 0)
    open_dir = parent.st_uid not in mine or (
        parent.st_mode & 0o002 and not parent.st_mode & stat.S_ISVTX
    )
    why = (
        f"owned by uid {st.st_uid}, not you"
        if st.st_uid not in mine
        else f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
        if st.st_mode & 0o022
        else "in a directory another user can write (it could be replaced)"
        if open_dir
        else None
    )
    if why:
        raise LaunchError(
            f"clusters file {path!r} is {why}: another user could change what it runs; accepted: "
            "a file only you can write (chmod go-w, owned by you)"
        )


def load(path: str | None = None) -> dict[str, Cluster]:
    """Every cluster of the file, validated (syntax only: local files are checked by get() for the
    one used)."""
    path = path or default_path()
    check_private(path)
    data = read_yaml_file(
        path,
        "clusters file",
        SHAPE,
        f"; accepted: {SHAPE} (${ENV_FILE} or $XDG_CONFIG_HOME/launchers/clusters.yaml)",
    )
    where = f"clusters file {path!r}"
    if not isinstance(data, dict) or not data:
        raise LaunchError(f"{where} must be a non-empty mapping of clusters; accepted: {SHAPE}")
    out = {}
    for name, entry in data.items():
        if not isinstance(name, str) or not NAME.match(name) or name in RESERVED:
            raise LaunchError(
                f"{where}: cluster name {brief(name)} is not accepted; accepted: letters, digits, "
                f"_ . - (at most 64, not {', '.join(RESERVED)})"
            )
        out[name] = parse_entry(name, entry, path)
    return out


def parse_entry(name: str, entry: Any, path: str) -> Cluster:
    where = f"clusters file {path!r}: cluster {name!r}"
    if not isinstance(entry, dict):
        raise LaunchError(f"{where} must be a mapping of keys; accepted keys: {', '.join(KEYS)}")
    for key in entry:
        if key not in KEYS:
            raise LaunchError(f"{where}: unknown key {brief(key)}; accepted: {', '.join(KEYS)}")
    for key in REQUIRED:
        if entry.get(key) in (None, ""):
            raise LaunchError(f"{where}: {key} is missing; accepted: {SHAPE}")
    v = {k: read_value(k, val, where) for k, val in entry.items() if val is not None}
    for key in LOCAL_FILES:  # a relative path is relative to the clusters file
        if key in v:
            v[key] = os.path.join(os.path.dirname(os.path.abspath(path)), v[key])
    return Cluster(name=name, source=path, **v)


def text(key: str, value: Any, where: str) -> str:
    if (
        not isinstance(value, str)
        or not value.strip()
        or any(ord(c) < 32 or ord(c) == 127 for c in value)
    ):
        raise LaunchError(
            f"{where}: {key} {brief(value)} is not accepted; accepted: a non-empty string without "
            "control characters"
        )
    return value.strip()


def read_value(key: str, value: Any, where: str) -> Any:
    """One key's value, checked (the table of what each key accepts is this function's branches)."""
    if key == "port":
        s = str(value)
        if isinstance(value, bool) or not (
            INT_TEXT.fullmatch(s) and len(s) < 6 and 1 <= int(s) <= 65535
        ):
            raise LaunchError(
                f"{where}: port {brief(value)} is not accepted; accepted: an integer 1-65535"
            )
        return int(s)
    if key == "jump":
        hops = value if isinstance(value, list) else [value]
        if not hops:
            raise LaunchError(
                f"{where}: jump is an empty list; accepted: [user@]host[:port] or a list of them"
            )
        return tuple(jump_entry(text(key, h, where), where) for h in hops)
    s = text(key, value, where)
    if key == "login":
        name, user, port = parse_host_word(s, f"{where}: login")
        if user or port:
            raise LaunchError(
                f"{where}: login {brief(s)} is not accepted; accepted: a host name (give user: and "
                "port: as their own keys)"
            )
        return name
    if key == "user" and not USER.match(s):
        raise LaunchError(
            f"{where}: user {brief(s)} is not accepted; accepted: letters, digits, _ . -"
        )
    if key == "runs_root" and not posixpath.isabs(s):
        raise LaunchError(
            f"{where}: runs_root {brief(s)} is not accepted; accepted: an absolute path on the "
            "cluster's shared storage, e.g. /shared/$USER/runs"
        )
    if key == "runs_root":
        return posixpath.normpath(s)
    if key == "launch":
        return launch_command(s, where)
    return os.path.expanduser(s) if key in LOCAL_FILES else s


def launch_command(s: str, where: str) -> str:
    """The login node's `launch`: shell words (quotes allowed), each quoted again when the command
    line is built."""
    try:
        words = shlex.split(s)
    except ValueError as e:
        words, why = [], str(e)
    else:
        why = "no command"
    if not words:
        raise LaunchError(
            f"{where}: launch {brief(s)} is not accepted ({why}); accepted: the login node's "
            "launch command, shell words, e.g. /opt/venv/bin/launch"
        )
    return shlex.join(words)


def jump_entry(word: str, where: str) -> HostEntry:
    name, user, port = parse_host_word(word, f"{where}: jump")
    return HostEntry(word=word, name=name, user=user, port=port)


def get(name: str, path: str | None = None) -> Cluster:
    """The cluster NAME of the clusters file, its local files (identity, known_hosts, ssh_config)
    present."""
    path = path or default_path()
    found = load(path)
    if name not in found:
        raise LaunchError(
            f"--cluster {brief(name)} is not in clusters file {path!r}; accepted: "
            f"{', '.join(sorted(found))}"
        )
    c = found[name]
    for key in LOCAL_FILES:
        f = getattr(c, key)
        if f and not os.path.isfile(f):
            raise LaunchError(
                f"clusters file {path!r}: cluster {name!r}: {key} {f!r} does not exist; accepted: "
                "an existing file"
            )
    return c
