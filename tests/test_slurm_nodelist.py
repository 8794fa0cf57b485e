"""SLURM_JOB_NODELIST expansion on the nodes (pure logic; scontrol is not asked)."""
import pytest

from launchers.slurmnode import NodeError, job_hostnames


@pytest.mark.parametrize("text,hosts", [
    ("lnode1", ["lnode1"]),
    ("lnode[1-4]", ["lnode1", "lnode2", "lnode3", "lnode4"]),
    ("gpu[01-03,7],login1", ["gpu01", "gpu02", "gpu03", "gpu7", "login1"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a,b[2,4],c", ["a", "b2", "b4", "c"]),
    ("node-[5]", ["node-5"]),
])
def test_expands_in_slurm_order(text, hosts):
    assert job_hostnames(text) == hosts


def test_reads_the_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[3-4]")
    assert job_hostnames() == ["n3", "n4"]


@pytest.mark.parametrize("text", ["n[1-", "n[]", "n[a-b]", "n1]", "n[1-x]"])
def test_malformed_is_a_node_error_naming_it(text):
    with pytest.raises(NodeError, match="malformed") as e:
        job_hostnames(text)
    assert repr(text) in str(e.value)


def test_node_entry_arguments():
    from launchers.slurmnode import _parse
    assert _parse(["finalize", "/r", "--base-attempt", "2", "--srun-status", "140"]) == {
        "what": "finalize", "run_dir": "/r", "base_attempt": 2, "in_allocation": False, "srun_status": 140}
    assert _parse(["run", "/r", "--in-allocation"])["in_allocation"] is True


@pytest.mark.parametrize("argv", [[], ["run"], ["bogus", "/r"], ["run", "/r", "--base-attempt"],
                                  ["run", "/r", "--base-attempt", "x"], ["run", "/r", "--nope"]])
def test_node_entry_bad_arguments_exit_2(argv, capsys):
    from launchers.slurmnode import _parse
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    assert e.value.code == 2 and "usage: python -m launchers.slurmnode" in capsys.readouterr().err
