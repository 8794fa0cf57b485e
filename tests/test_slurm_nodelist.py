"""SLURM_JOB_NODELIST expansion on the nodes (pure logic; scontrol is not asked)."""

import pytest

from launchers.backends.slurm.env import NodelistError, SlurmEnv, job_hostnames
from launchers.backends.slurm.steps import slot_hosts


@pytest.mark.parametrize(
    "text,hosts",
    [
        ("lnode1", ["lnode1"]),
        ("lnode[1-4]", ["lnode1", "lnode2", "lnode3", "lnode4"]),
        ("gpu[01-03,7],login1", ["gpu01", "gpu02", "gpu03", "gpu7", "login1"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b[2,4],c", ["a", "b2", "b4", "c"]),
        ("node-[5]", ["node-5"]),
    ],
)
def test_expands_in_slurm_order(text, hosts):
    assert job_hostnames(text) == hosts


def test_reads_the_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[3-4]")
    assert SlurmEnv.read().hostnames() == ["n3", "n4"]


def test_slurm_env_table():
    env = SlurmEnv.read(
        {
            "SLURM_JOB_ID": "12",
            "SLURM_NODEID": "3",
            "SLURM_NNODES": "4",
            "SLURM_RESTART_COUNT": "2",
            "SLURM_JOB_NODELIST": "a[1-4]",
        }
    )
    assert (env.job_id, env.node_id, env.num_nodes, env.restart_count, env.in_allocation) == (
        "12",
        3,
        4,
        2,
        True,
    )
    assert env.submitit_job_id == "12" and SlurmEnv.read({}).in_allocation is False


@pytest.mark.parametrize("text", ["n[1-", "n[]", "n[a-b]", "n1]", "n[1-x]"])
def test_malformed_is_a_node_error_naming_it(text):
    with pytest.raises(NodelistError, match="malformed") as e:
        job_hostnames(text)
    assert repr(text) in str(e.value)


def test_node_entry_arguments():
    from launchers.backends.slurm.task import parse_args

    assert parse_args(["finalize", "/r", "--base-attempt", "2", "--srun-status", "140"]) == {
        "what": "finalize",
        "run_dir": "/r",
        "base_attempt": 2,
        "in_allocation": False,
        "srun_status": 140,
    }
    assert parse_args(["run", "/r", "--in-allocation"])["in_allocation"] is True


def test_node_entry_takes_the_old_submitit_folder_form(tmp_path):
    """Scripts of jobs queued before the move pass RUN_DIR/slurm to `task`: the run dir is meant."""
    from launchers.backends.slurm.task import parse_args

    (tmp_path / "run.yaml").write_text("run_id: x\n")
    (tmp_path / "slurm").mkdir()
    assert parse_args(["task", str(tmp_path / "slurm")])["run_dir"] == str(tmp_path)
    assert parse_args(["task", str(tmp_path)])["run_dir"] == str(tmp_path)


def test_old_entry_name_is_the_same_entry():
    import launchers.slurmnode as old
    from launchers.backends.slurm import task

    assert old.parse_args is task.parse_args and old.main is task.main


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["run"],
        ["bogus", "/r"],
        ["run", "/r", "--base-attempt"],
        ["run", "/r", "--base-attempt", "x"],
        ["run", "/r", "--nope"],
    ],
)
def test_node_entry_bad_arguments_exit_2(argv, capsys):
    from launchers.backends.slurm.task import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert (
        e.value.code == 2
        and "usage: python -m launchers.backends.slurm.task" in capsys.readouterr().err
    )


def test_a_step_of_the_loop_over_attempts_ranks_its_nodes_by_the_hosts_it_was_given():
    """--spares: the batch step's loop names each step's hosts in node-rank order (the first: node
    0, the master) and its attempt; a node's rank is its host's place in that list, not SLURM_NODEID
    (Slurm numbers a step's nodes in the allocation's order); a node not in the list is one line
    naming it and the list."""
    base = {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "lnode[1-3]"}
    env = SlurmEnv.read(
        {
            **base,
            "SLURMD_NODENAME": "lnode1",
            "LAUNCH_STEP_HOSTS": "lnode3,lnode1",
            "LAUNCH_STEP_SLOTS": "1,2",
            "LAUNCH_STEP_ATTEMPT": "4",
        }
    )
    assert (env.step_node(), env.step_attempt, env.step_hosts, env.step_slots) == (
        1,
        4,
        ("lnode3", "lnode1"),
        (1, 2),
    )
    # the slots: the allocation with the batch host (where the loop runs) last -- the last spare
    # taken
    assert slot_hosts(["lnode1", "lnode2", "lnode3"], "lnode1") == ["lnode2", "lnode3", "lnode1"]
    assert SlurmEnv.read(base).step_node() == 0 and SlurmEnv.read(base).step_attempt is None
    with pytest.raises(
        NodelistError,
        match=r"this node \(lnode2\) is not one of the step's hosts \(lnode3,lnode1\)",
    ):
        SlurmEnv.read(
            {**base, "SLURMD_NODENAME": "lnode2", "LAUNCH_STEP_HOSTS": "lnode3,lnode1"}
        ).step_node()


def test_a_node_inside_slurms_oci_container_is_found_by_its_host_name():
    """srun --container (Slurm 22.05): the task sees the step's variables only;
    SLURM_NODEID/PROCID/SLURMD_NODENAME, when present, are the batch step's (srun --export=ALL), so
    the node is its host's place in the step."""
    import socket

    from launchers.backends.slurm.env import SlurmEnv

    me = socket.gethostname().split(".")[0]
    stale = {
        "SLURM_JOB_ID": "7",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURMD_NODENAME": "other",
    }
    inside = SlurmEnv.read(
        {**stale, "SLURM_CONTAINER": "/b", "SLURM_STEP_NODELIST": f"zz[1-2],{me}"}
    )
    assert (inside.node_id, inside.procid, inside.node_name) == (2, "2", me)
    outside = SlurmEnv.read({**stale, "SLURM_STEP_NODELIST": f"zz[1-2],{me}"})
    assert (outside.node_id, outside.procid, outside.node_name) == (0, "0", "other")


def test_the_lost_node_is_the_one_slurm_names_down_when_several_recorded_no_exit():
    """A partitioned, paused node leaves its peer blocked in a collective; Slurm kills both with the
    step, so neither records an exit: the lost one is the node whose host sinfo shows not responding
    (or down), not the first of them (the first Slurm cut row blamed the live node 0 and restarted
    on the cut one)."""
    from launchers.backends.slurm.requeue import lost_node

    recs = {0: {"state": "RUNNING", "host": "lnode2"}, 1: {"state": "RUNNING", "host": "lnode3"}}
    asked = []

    def sinfo(hosts):
        asked.append(hosts)
        return {"lnode3"}

    assert lost_node([0, 1], recs, sinfo)["host"] == "lnode3" and asked == [["lnode2", "lnode3"]]
    assert lost_node([0, 1], recs, lambda hosts: set())["node"] == 0  # Slurm names none: the first
    assert (
        lost_node([1], recs, lambda hosts: pytest.fail("one missing node needs no question"))[
            "node"
        ]
        == 1
    )
    assert lost_node([], recs, sinfo) is None
