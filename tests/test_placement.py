"""Ranks from the scheduler that started the processes (session.placement), with the variables Slurm's srun and
Open MPI's mpirun really set (Slurm's sbatch/srun "OUTPUT ENVIRONMENT VARIABLES"; Open MPI 5's "Environment
variables set for MPI applications"), never from the order the processes reported in."""

import pytest

from neuron_lab.session import launch, placement
from neuron_lab.session.placement import MPI, SLURM, TORCHRUN, Place, PlacementError, Seen


def _slurm(procid: int, nodeid: int, localid: int, node: str) -> Seen:
    """What srun -N2 --ntasks-per-node=2 gives task ``procid`` (block distribution)."""
    return Seen(node, {"SLURM_JOB_ID": "41", "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid),
                       "SLURM_NODEID": str(nodeid), "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
                       "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_TASKS_PER_NODE": "2(x2)",
                       "SLURM_STEP_NODELIST": "trn[01-02]", "SLURMD_NODENAME": node})


def _ompi(rank: int, local: int, host: str) -> Seen:
    return Seen(host, {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "4",
                       "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                       "OMPI_COMM_WORLD_NODE_RANK": str(local), "OMPI_UNIVERSE_SIZE": "4"})


def test_slurm_ranks_are_srun_s_task_ids_whatever_order_the_engines_registered_in():
    seen = [_slurm(2, 1, 0, "trn02"), _slurm(0, 0, 0, "trn01"), _slurm(3, 1, 1, "trn02"), _slurm(1, 0, 1, "trn01")]
    assert placement.place(seen) == [
        Place(2, 0, 4, 2, 1, 2, "trn02", SLURM), Place(0, 0, 4, 2, 0, 2, "trn01", SLURM),
        Place(3, 1, 4, 2, 1, 2, "trn02", SLURM), Place(1, 1, 4, 2, 0, 2, "trn01", SLURM)]


def test_slurms_tasks_per_node_is_read_as_slurm_writes_it():
    assert placement.slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    seen = [_slurm(0, 0, 0, "a"), _slurm(1, 0, 1, "a"), _slurm(2, 1, 0, "b")]
    for s in seen:
        s.env.update({"SLURM_NTASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1"})  # type: ignore[attr-defined]
    assert [(p.local_world_size, p.node) for p in placement.place(seen)] == [(2, 0), (2, 0), (1, 1)]
    with pytest.raises(PlacementError, match=r"'2\(3\)' is not N or N\(xM\)"):
        placement.slurm_tasks_per_node("2(3)")


def test_open_mpi_ranks_and_nodes_in_the_order_of_their_lowest_rank():
    seen = [_ompi(3, 1, "hostB"), _ompi(1, 1, "hostA"), _ompi(0, 0, "hostA"), _ompi(2, 0, "hostB")]
    assert [(p.rank, p.local_rank, p.local_world_size, p.node, p.nnodes, p.source)
            for p in placement.place(seen)] == [(3, 1, 2, 1, 2, MPI), (1, 1, 2, 0, 2, MPI), (0, 0, 2, 0, 2, MPI),
                                                (2, 0, 2, 1, 2, MPI)]


def test_torchrun_ranks_keep_their_group_rank():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1"}
    seen = [Seen("b", env), Seen("a", {**env, "RANK": "0", "GROUP_RANK": "0"})]
    assert [(p.rank, p.node, p.source) for p in placement.place(seen)] == [(1, 1, TORCHRUN), (0, 0, TORCHRUN)]


def test_engines_nothing_numbered_are_ranked_host_by_host():
    seen = [Seen("a", {}), Seen("b", {}), Seen("a", {}), Seen("b", {})]
    assert [(p.rank, p.local_rank, p.node, p.host) for p in placement.place(seen)] == [
        (0, 0, 0, "a"), (2, 0, 1, "b"), (1, 1, 0, "a"), (3, 1, 1, "b")]


@pytest.mark.parametrize(("seen", "message"), [
    ([_ompi(0, 0, "a"), _ompi(0, 0, "b"), _ompi(2, 0, "b"), _ompi(3, 1, "b")],
     r"ranks 0..3, but they say \[0, 0, 2, 3\]"),
    ([_ompi(0, 0, "a"), _ompi(1, 1, "a")], r"2 processes, but their world size says \[4\]"),
    ([_ompi(0, 0, "a"), Seen("a", {})], "1 of 2 have no rank variables"),
])
def test_processes_that_do_not_make_one_world_say_why(seen, message):
    with pytest.raises(PlacementError, match=message):
        placement.place(seen)


def test_each_rank_gets_rank_0s_host_its_own_core_and_the_groups_root_comm_id():
    p = placement.place([_slurm(3, 1, 1, "trn02")] + [_slurm(r, r // 2, r % 2, f"trn0{r // 2 + 1}") for r in (0, 1, 2)])
    master = next(q.host for q in p if q.rank == 0)
    envs = {q.rank: placement.rank_env(q, master, 29500, 46820, host_cores=[4, 5, 6, 7]) for q in p}
    assert {e["MASTER_ADDR"] for e in envs.values()} == {"trn01"}
    assert {e["NEURON_RT_ROOT_COMM_ID"] for e in envs.values()} == {"trn01:46820"}
    assert [(envs[r]["RANK"], envs[r]["LOCAL_RANK"], envs[r]["GROUP_RANK"], envs[r]["NEURON_RT_VISIBLE_CORES"])
            for r in range(4)] == [("0", "0", "0", "4"), ("1", "1", "0", "5"), ("2", "0", "1", "4"),
                                   ("3", "1", "1", "5")]
    with pytest.raises(PlacementError, match="local rank 1 on trn02, which has only 1 NeuronCores"):
        placement.core_of(p[0], host_cores=[0])


def test_launched_ranks_on_two_nodes_get_torchruns_multi_node_mapping():
    envs = launch.rank_envs({}, 2, port=29511, nnodes=2)
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["NEURON_RT_VISIBLE_CORES"]) for e in envs] == [
        ("0", "0", "0", "0"), ("1", "1", "0", "1"), ("2", "0", "1", "0"), ("3", "1", "1", "1")]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) for e in envs} == {("4", "2", "2")}
    assert len({e["NEURON_RT_ROOT_COMM_ID"] for e in envs}) == 1


def test_each_emulated_host_gets_its_instance_and_every_rank_the_groups_root_comm_id() -> None:
    envs = launch.rank_envs({}, 2, 29500, 2, launch.host_instances("trn2.48xlarge,trn1.32xlarge", 2))
    names = ("RANK", "NEURON_LAB_HOST", "NEURON_LAB_INSTANCE", "NEURON_RT_VISIBLE_CORES")
    assert [tuple(e[n] for n in names) for e in envs] == [
        ("0", "host0", "trn2.48xlarge", "0"), ("1", "host0", "trn2.48xlarge", "1"),
        ("2", "host1", "trn1.32xlarge", "0"), ("3", "host1", "trn1.32xlarge", "1")]
    [root] = {e["NEURON_RT_ROOT_COMM_ID"] for e in envs}  # one for the group, on every rank
    assert root.startswith(f"{envs[0]['MASTER_ADDR']}:") and root != f"{envs[0]['MASTER_ADDR']}:29500"
    assert launch.host_instances("trn1.2xlarge", 3) == ["trn1.2xlarge"] * 3
