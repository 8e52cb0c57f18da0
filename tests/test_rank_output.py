"""What a `%%neuron ranks` cell shows of its ranks' stderr (each distinct line once, with the ranks that printed it),
and what a cell's own `init_process_group`/`destroy_process_group` meet on a rank the workbench started: a real
one-rank gloo group in this process stands for the ranks' group (the engines' version is tests/test_ranks.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from neuron_lab.report.ranks import ranks_label
from neuron_lab.session import rank_group
from neuron_lab.session.rank_output import collapse


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
    assert collapse(texts, "[stderr:{ranks}] ", "[ranks {ranks}] ") == [
        "[ranks 0-2] /tmp/ipykernel_101/12.py:3: UserWarning: slow",
        "[ranks 0-1] [W1206 09:21:24.123456 777 Gloo.cpp:9] noise",
        "[stderr:0] rank 0 only",
        "[stderr:1] rank 1 only",
        "[ranks 2-3] [Gloo] Rank 2 is connected to 2 peer ranks."]


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
