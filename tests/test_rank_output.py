"""What a `%%neuron ranks` cell shows of what its ranks print (each line alike once, with the ranks that printed it;
the numbers that differ as each rank's, the rank that stands apart marked; lines as they come, each rank's in order),
and what a cell's own `init_process_group`/`destroy_process_group` meet on a rank the workbench started: a real
one-rank gloo group in this process stands for the ranks' group (the engines' version is tests/test_ranks.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from neuron_lab.report.rank_lines import Collapser, collapse
from neuron_lab.report.ranks import outliers, ranks_label
from neuron_lab.session import rank_group


@pytest.mark.parametrize(("ranks", "label"), [([1], "1"), ([0, 1], "0-1"), ([3, 0, 1, 2], "0-3"), ([0, 2], "0,2"),
                                              ([0, 1, 4, 6, 7], "0-1,4,6-7")])
def test_ranks_are_labelled_as_runs(ranks: list[int], label: str) -> None:
    assert ranks_label(ranks) == label


def test_lines_alike_on_several_ranks_are_shown_once_with_their_ranks() -> None:
    texts = {0: ["/tmp/ipykernel_101/12.py:3: UserWarning: slow", "[W1206 09:21:24.123456 777 Gloo.cpp:9] noise",
                 "rank 0 only"],
             1: ["/tmp/ipykernel_202/12.py:3: UserWarning: slow", "[W1206 09:21:25.654321 888 Gloo.cpp:9] noise",
                 "rank 1 only"],
             2: ["/tmp/ipykernel_303/12.py:3: UserWarning: slow", "[Gloo] Rank 2 is connected to 2 peer ranks."],
             3: ["[Gloo] Rank 3 is connected to 2 peer ranks."]}
    assert collapse(texts, ("[stderr:{ranks}] ", "[ranks {ranks}] ")) == [
        "[ranks 0-2] /tmp/ipykernel_101/12.py:3: UserWarning: slow",
        "[ranks 0-1] [W1206 09:21:24.123456 777 Gloo.cpp:9] noise",
        "[stderr:0] rank 0 only",
        "[stderr:1] rank 1 only",
        "[ranks 2-3] [Gloo] Rank 2 is connected to 2 peer ranks."]


def test_c10d_warnings_tagged_with_each_rank_and_its_own_timestamp_are_shown_once() -> None:
    """DDP's logger.cpp warning, as each rank of a group logs it: ``[rankN]:`` and a timestamp with no thread."""
    said = "logger.cpp:329] Warning: Time stats are currently only collected for CPU and CUDA devices."
    texts = {r: [f"[rank{r}]:[W1207 14:09:00.38652248{r} {said}", f"[rank{r}]: mine"] for r in range(4)}
    assert collapse(texts, ("[stderr:{ranks}] ", "[ranks {ranks}] ")) == [
        f"[ranks 0-3] [W1207 14:09:00.386522480 {said}",
        *(f"[stderr:{r}] [rank{r}]: mine" for r in range(4))]  # not c10d's log line: each rank's own


def test_numbers_that_differ_are_shown_once_with_each_ranks_value_and_the_rank_apart_marked() -> None:
    texts = {0: ["epoch 1 loss 0.51", "rank 0 of 4 on neuron:0", "step 3"],
             1: ["epoch 1 loss 0.50", "rank 1 of 4 on neuron:1", "step 3"],
             2: ["epoch 1 loss 0.52", "rank 2 of 4 on neuron:2", "step 3", "saved"],
             3: ["epoch 1 loss nan", "rank 3 of 4 on neuron:3", "step 3"]}
    assert collapse(texts) == ["[ranks 0-3] epoch 1 loss {0: 0.51, 1: 0.50, 2: 0.52, 3: nan ← rank 3}",
                               "[stdout:0] rank 0 of 4 on neuron:0", "[stdout:1] rank 1 of 4 on neuron:1",
                               "[stdout:2] rank 2 of 4 on neuron:2", "[stdout:3] rank 3 of 4 on neuron:3",
                               "[ranks 0-3] step 3", "[stdout:2] saved"]


@pytest.mark.parametrize(("values", "apart"), [({0: 0.51, 1: 0.50, 2: 0.52, 3: 0.93}, [3]),
                                               ({0: 1.0, 1: 1.01, 2: 0.99, 3: 1.02}, []),
                                               ({0: 5.0, 1: 5.0, 2: 5.0, 3: 0.0}, [3]),
                                               ({0: 0.5, 1: 0.9}, [])])
def test_a_rank_stands_apart_from_the_median_of_three_or_more(values: dict[int, float], apart: list[int]) -> None:
    assert outliers(values) == apart


def test_a_line_is_shown_once_every_running_rank_printed_it_or_its_window_passed_each_ranks_in_order() -> None:
    now = [0.0]
    lines = Collapser([0, 1, 2], window_s=0.5, clock=lambda: now[0])
    assert lines.add(0, "epoch 1") == [] and lines.add(0, "rank 0 saves") == [] and lines.add(1, "epoch 1") == []
    assert lines.add(2, "epoch 1") == ["[ranks 0-2] epoch 1"]
    assert lines.add(1, "epoch 2") == [] and lines.add(0, "epoch 2") == []  # rank 0's own line is before it
    now[0] = 0.5
    assert lines.due() == ["[stdout:0] rank 0 saves", "[ranks 0-1] epoch 2"]
    assert lines.add(2, "epoch 2") == ["[stdout:2] epoch 2"]  # late: its own line
    assert lines.add(1, "done") == [] and lines.leave(2) == [] and lines.add(0, "done") == ["[ranks 0-1] done"]


@pytest.fixture
def group() -> Iterator[None]:
    """A one-rank gloo process group in this process, kept as %neuron ranks keeps the ranks' group; gone after."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch_own = dist.init_process_group, dist.destroy_process_group
    rank_group.keep()
    try:
        yield
    finally:
        rank_group.release()
        assert (dist.init_process_group, dist.destroy_process_group) == torch_own  # torch's own back
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_groups_own_init_is_skipped_in_one_line_and_its_destroy_keeps_it(group, capsys) -> None:
    dist.init_process_group(backend="gloo")
    dist.init_process_group("cpu:gloo,neuron:gloo", world_size=1, rank=0)
    dist.destroy_process_group()
    assert dist.is_initialized()
    assert capsys.readouterr().err.splitlines() == [rank_group.SKIPPED, rank_group.SKIPPED, rank_group.KEPT]


@pytest.mark.parametrize(("kwargs", "asked"), [({"backend": "nccl"}, "backend 'nccl'"),
                                               ({"world_size": 4}, "world size 4"),
                                               ({"backend": "gloo", "rank": 1}, "rank 1 (this is rank 0)")])
def test_another_default_group_is_one_line_saying_what_differs(group, kwargs: dict, asked: str) -> None:
    with pytest.raises(rank_group.ProcessGroupExists) as e:
        dist.init_process_group(**kwargs)
    assert e.value._render_traceback_() == [
        "ProcessGroupExists: the process group already exists (started by %neuron ranks: backend gloo, world size 1), "
        f"not {asked}; dist.new_group() makes another group on these ranks"]
    assert dist.is_initialized()


def test_a_group_the_cell_made_is_the_cells_to_destroy(group) -> None:
    sub = dist.new_group([0])
    dist.destroy_process_group(sub)
    assert dist.is_initialized() and sub not in dist.distributed_c10d._world.pg_map
