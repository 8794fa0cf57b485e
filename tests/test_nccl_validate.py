"""Validator rules, table-driven, per NCCL version (pure logic)."""
import pytest

from nccl_tuning.errors import NcclTuningError
from nccl_tuning.knowledge import DEBUGGING_CLASS, NAMES, REMOVED, parse_int, parse_version
from nccl_tuning.validate import validate

SEED = {"NCCL_ALGO": "ring", "NCCL_PROTO": "shm", "NCCL_SHM_DISABLE": "0"}


def one(env, version=None, production=True):
    return [(f.severity, f.variable) for f in validate(env, version, production)]


@pytest.mark.parametrize("version", [None, "2.30.7", "2.24", "2.23", "2.21.5", "2.18", "2.12"])
def test_seed_preset_three_findings(version):
    fs = validate(SEED, version)
    assert [(f.severity, f.variable) for f in fs] == [
        ("warning", "NCCL_ALGO"), ("error", "NCCL_PROTO"), ("note", "NCCL_SHM_DISABLE")]
    algo, proto, shm = fs
    assert "all-to-all" in algo.message and "Tree" in algo.message
    assert "LL, LL128, Simple" in proto.message
    assert "default" in shm.message


@pytest.mark.parametrize("version,needle", [
    ("2.30.7", "Unrecognized element token"), ("2.24", "Unrecognized element token"),
    ("2.23", "ignores unknown tokens silently"), ("2.19", "ignores unknown tokens silently")])
def test_proto_unknown_token_consequence_per_version(version, needle):
    (f,) = [f for f in validate({"NCCL_PROTO": "shm"}, version) if f.severity == "error"]
    assert needle in f.message


def test_algo_nvls_disabled_only_where_it_exists():
    new = validate({"NCCL_ALGO": "ring"}, "2.30")[0].message
    old = validate({"NCCL_ALGO": "ring"}, "2.16")[0].message
    assert "NVLS" in new and "PAT" in new
    assert "NVLS" not in old and "PAT" not in old


@pytest.mark.parametrize("env,version,expected", [
    # unknown / removed / not-NCCL names
    ({"NCCL_PROTOCOL": "LL"}, None, [("error", "NCCL_PROTOCOL")]),
    ({"NCCL_TIMEOUT": "1800"}, None, [("error", "NCCL_TIMEOUT")]),
    ({"NCCL_ASYNC_ERROR_HANDLING": "1"}, None, [("warning", "NCCL_ASYNC_ERROR_HANDLING")]),
    ({"NCCL_LL_THRESHOLD": "0"}, None, [("warning", "NCCL_LL_THRESHOLD")]),
    ({"NCCL_IB_GDR_LEVEL": "PHB"}, None, [("warning", "NCCL_IB_GDR_LEVEL")]),
    # ALGO / PROTO tokens, case, negation, per-collective syntax, version gates
    ({"NCCL_ALGO": "RING,tree"}, None, [("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "tree"}, None, [("error", "NCCL_ALGO")]),   # broadcast etc. have no Tree
    ({"NCCL_ALGO": "^tree"}, None, [("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "^ring"}, None, [("error", "NCCL_ALGO")]),       # broadcast/reduce: Ring only
    ({"NCCL_ALGO": "allreduce:tree,ring;allgather:ring"}, "2.24", [("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "allreduce:tree,ring;allgather:ring"}, "2.23", [("error", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "allreduce:tree;ring"}, None, [("error", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "allreduce:tree;alltoall:ring"}, None, [("error", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "allreduce:tree"}, None, [("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "ring,pat"}, "2.23", [("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "ring,pat"}, "2.22", [("warning", "NCCL_ALGO"), ("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "ring,pat"}, "2.24", [("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "ring,nvls"}, "2.16", [("warning", "NCCL_ALGO"), ("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "ring,nvls"}, "2.24", [("warning", "NCCL_ALGO")]),
    ({"NCCL_ALGO": "ring,foo"}, "2.24", [("error", "NCCL_ALGO")]),
    ({"NCCL_PROTO": "^LL128"}, None, [("warning", "NCCL_PROTO")]),   # debugging class only
    ({"NCCL_PROTO": "ll,simple"}, None, [("warning", "NCCL_PROTO")]),
    ({"NCCL_PROTO": "LL128"}, None, [("warning", "NCCL_PROTO")]),    # forced LL128
    ({"NCCL_PROTO": "^LL,LL128,Simple"}, None, [("error", "NCCL_PROTO")]),
    ({"NCCL_ALGO": "ring", "NCCL_PROTO": "LL"}, None,
     [("warning", "NCCL_ALGO"), ("warning", "NCCL_PROTO")]),
    ({"NCCL_ALGO": "allreduce:nvls", "NCCL_PROTO": "allreduce:LL"}, None,
     [("warning", "NCCL_ALGO"), ("warning", "NCCL_PROTO"), ("error", "NCCL_PROTO")]),
    # integers the way strtoll(base 0) reads them
    ({"NCCL_BUFFSIZE": "4M"}, None, [("warning", "NCCL_BUFFSIZE")]),
    ({"NCCL_BUFFSIZE": "010"}, None, [("note", "NCCL_BUFFSIZE")]),
    ({"NCCL_BUFFSIZE": "0x400000"}, None, [("note", "NCCL_BUFFSIZE")]),   # = default
    ({"NCCL_BUFFSIZE": "3000000"}, None, [("warning", "NCCL_BUFFSIZE")]),
    ({"NCCL_BUFFSIZE": "big"}, None, [("error", "NCCL_BUFFSIZE")]),
    ({"NCCL_BUFFSIZE": "99999999999999999999"}, None, [("error", "NCCL_BUFFSIZE")]),
    ({"NCCL_NTHREADS": "96"}, None, [("error", "NCCL_NTHREADS")]),
    ({"NCCL_NTHREADS": "256"}, None, [("warning", "NCCL_NTHREADS")]),
    ({"NCCL_NTHREADS": "1024"}, None, [("error", "NCCL_NTHREADS")]),
    ({"NCCL_IB_TIMEOUT": "40"}, None, [("error", "NCCL_IB_TIMEOUT")]),
    ({"NCCL_IB_TIMEOUT": "22"}, None, []),
    ({"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"}, None,
     [("error", "NCCL_NSOCKS_PERTHREAD")]),
    # booleans
    ({"NCCL_P2P_DISABLE": "true"}, None, [("error", "NCCL_P2P_DISABLE")]),
    ({"NCCL_P2P_DISABLE": "2"}, None, [("error", "NCCL_P2P_DISABLE")]),
    ({"NCCL_P2P_DISABLE": "1"}, None, [("warning", "NCCL_P2P_DISABLE")]),   # debugging class
    ({"NCCL_IB_DISABLE": "0"}, None, [("note", "NCCL_IB_DISABLE")]),
    # enums and levels
    ({"NCCL_DEBUG": "INFO"}, None, []),
    ({"NCCL_DEBUG": "info"}, None, [("note", "NCCL_DEBUG")]),
    ({"NCCL_DEBUG": "VERBOSE"}, None, [("error", "NCCL_DEBUG")]),
    ({"NCCL_DEBUG": "ABORT"}, "2.21", [("error", "NCCL_DEBUG")]),
    ({"NCCL_DEBUG": "TRACE"}, None, [("note", "NCCL_DEBUG")]),
    ({"NCCL_DEBUG_SUBSYS": "INIT,^NET"}, None, [("warning", "NCCL_DEBUG_SUBSYS")]),
    ({"NCCL_DEBUG_SUBSYS": "^COLL,P2P"}, None, []),
    ({"NCCL_DEBUG_SUBSYS": "init,ras"}, "2.21", [("warning", "NCCL_DEBUG_SUBSYS")]),
    ({"NCCL_P2P_LEVEL": "NVL"}, None, [("warning", "NCCL_P2P_LEVEL")]),      # debugging class
    ({"NCCL_P2P_LEVEL": "nvl"}, None, [("error", "NCCL_P2P_LEVEL")]),
    ({"NCCL_NET_GDR_LEVEL": "PHB"}, None, [("warning", "NCCL_NET_GDR_LEVEL")]),
    ({"NCCL_NET_GDR_LEVEL": "FAST"}, None, [("error", "NCCL_NET_GDR_LEVEL")]),
    ({"NCCL_NET_GDR_LEVEL": "2"}, None, [("warning", "NCCL_NET_GDR_LEVEL")]),
    ({"NCCL_LAUNCH_MODE": "group"}, None, [("error", "NCCL_LAUNCH_MODE")]),
    ({"NCCL_SOCKET_FAMILY": "AF_INET6"}, None, []),
    ({"NCCL_NET": "AWS-OFI"}, None, [("note", "NCCL_NET")]),
    ({"NCCL_DEBUG_FILE": "/tmp/nccl.log"}, None, [("warning", "NCCL_DEBUG_FILE")]),
    # version gates on names
    ({"NCCL_NVLS_ENABLE": "0"}, "2.16", [("warning", "NCCL_NVLS_ENABLE")]),
    ({"NCCL_TUNER_PLUGIN": "libtuner.so"}, "2.18", [("warning", "NCCL_TUNER_PLUGIN")]),
    ({"NCCL_TUNER_PLUGIN": "libtuner.so"}, "2.19", []),
    # PyTorch names and unrelated names
    ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}, None, []),
    ({"TORCH_NCCL_DUMP_ON_TIMOUT": "1"}, None, [("warning", "TORCH_NCCL_DUMP_ON_TIMOUT")]),
    ({"PATH": "/bin", "OMP_NUM_THREADS": "1"}, None, []),
])
def test_rules(env, version, expected):
    assert one(env, version) == expected


def test_did_you_mean():
    (f,) = validate({"NCCL_PROTOCOL": "LL"})
    assert "did you mean NCCL_PROTO?" in f.message
    (f,) = validate({"NCCL_SOCKET_IFACE": "eth0"})
    assert "did you mean NCCL_SOCKET_IFNAME?" in f.message


def test_debugging_class_is_a_note_outside_production():
    assert one({"NCCL_BUFFSIZE": "8388608"}, production=False) == [("note", "NCCL_BUFFSIZE")]
    assert one({"NCCL_BUFFSIZE": "8388608"}, production=True) == [("warning", "NCCL_BUFFSIZE")]


def test_messages_name_variable_value_and_accepted():
    (f,) = validate({"NCCL_NTHREADS": "96"})
    assert str(f).startswith("error NCCL_NTHREADS=96: ")
    assert "64, 128, 256, 512" in f.message


def test_data_files_loaded_as_sets():
    assert len(NAMES) == 245 and "NCCL_PROTO" in NAMES
    assert "NCCL_IB_GDR_LEVEL" in REMOVED and "NCCL_ALGO" in DEBUGGING_CLASS


@pytest.mark.parametrize("text,value,rest", [
    ("010", 8, ""), ("0x10", 16, ""), ("4M", 4, "M"), ("08", 0, "8"), ("-5", -5, ""),
    (" 12", 12, ""), ("0x", 0, "x"), ("abc", 0, "abc"), ("+7k", 7, "k")])
def test_parse_int_like_strtoll(text, value, rest):
    p = parse_int(text)
    assert (p.value, p.rest) == (value, rest)


def test_newer_and_older_versions_noted():
    assert one({}, "2.31") == [("note", "nccl-version")]
    assert one({}, "2.8") == [("note", "nccl-version")]
    with pytest.raises(NcclTuningError, match="not a version"):
        parse_version("latest")
