"""Memory history and snapshots of the `neuron` device, as CUDA records them: ``torch.neuron.memory`` gives the
dict ``torch.cuda.memory._snapshot()`` gives, and PyTorch's own ``torch.cuda._memory_viz`` reads it."""

from __future__ import annotations

import gc
import inspect
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from conftest import core
from torch.cuda import _memory_viz

import neuron_lab  # noqa: F401  (installs the backend)

history = torch.neuron.memory
KIB_1000, MIB_3 = 1000, 3 << 20


@pytest.fixture(autouse=True)
def _history_off() -> Iterator[None]:
    """Start without cached segments from earlier tests, and leave history off and empty."""
    gc.collect()
    torch.neuron.empty_cache()
    yield
    history._record_memory_history(None)


def _empty(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8, device="neuron")


def _ours(snap: dict) -> dict:
    """The snapshot restricted to the segments this test's history touched (earlier tests may hold others)."""
    trace = snap["device_traces"][0]
    addrs = {e["addr"] for e in trace if "addr" in e}
    return {**snap, "segments": [s for s in snap["segments"] if s["address"] in addrs]}


def _allocate_free_reuse() -> tuple[dict, list[int], torch.Tensor, torch.Tensor]:
    """1000 B and 3 MiB, free the first, allocate 1000 B again: the snapshot then, and the lines of a, b and c."""
    history._record_memory_history(max_entries=1000)
    here = inspect.currentframe().f_lineno
    a = torch.empty(KIB_1000, dtype=torch.uint8, device="neuron")
    b = torch.empty(MIB_3, dtype=torch.uint8, device="neuron")
    del a
    c = torch.empty(KIB_1000, dtype=torch.uint8, device="neuron")
    return history._snapshot(), [here + 1, here + 2, here + 4], b, c


def _frame(line: int, name: str = "_allocate_free_reuse") -> dict:
    return {"filename": __file__, "line": line, "name": name}


def test_the_trace_records_segments_allocations_and_frees_in_order() -> None:
    call = inspect.currentframe().f_lineno + 1
    snap, (line_a, _, line_c), b, c = _allocate_free_reuse()
    trace = snap["device_traces"][0]
    got = [(e["action"], e["size"]) for e in trace]
    head = [("segment_alloc", 1024), ("alloc", KIB_1000), ("segment_alloc", MIB_3), ("alloc", MIB_3),
            ("free_requested", KIB_1000), ("free_completed", KIB_1000)]
    if core() == "compiled":  # the freed 1 KiB segment stays cached and is handed out again, at its address
        assert got == [*head, ("alloc", KIB_1000)]
        assert trace[-1]["addr"] == trace[0]["addr"] == trace[1]["addr"]
    else:  # no cache: the segment goes with the storage
        assert got == [*head, ("segment_free", 1024), ("segment_alloc", 1024), ("alloc", KIB_1000)]
    assert all(e["stream"] == 0 and e["time_us"] > 0 for e in trace)
    test = test_the_trace_records_segments_allocations_and_frees_in_order.__name__
    assert trace[1]["frames"][:2] == [_frame(line_a), _frame(call, test)]  # innermost first, the emulator left out
    assert trace[-1]["frames"][0] == _frame(line_c)


def test_segments_show_each_block_in_its_size_class() -> None:
    snap, (_, line_b, line_c), b, c = _allocate_free_reuse()
    segs = _ours(snap)["segments"]
    small, large = sorted(segs, key=lambda s: s["total_size"])
    assert len(segs) == 2
    common = {"device": 0, "stream": 0, "segment_pool_id": (0, 0), "is_expandable": False}
    assert {k: small[k] for k in common} == common == {k: large[k] for k in common}
    assert (small["segment_type"], small["total_size"], small["allocated_size"], small["active_size"],
            small["requested_size"]) == ("small", 1024, 1024, 1024, KIB_1000)
    assert (large["segment_type"], large["total_size"], large["allocated_size"], large["requested_size"]) == (
        "large", MIB_3, MIB_3, MIB_3)
    [block] = small["blocks"]
    assert {k: v for k, v in block.items() if k != "frames"} == {
        "address": small["address"], "size": 1024, "requested_size": KIB_1000, "state": "active_allocated"}
    assert block["frames"][0] == _frame(line_c)
    assert large["blocks"][0]["state"] == "active_allocated" and large["blocks"][0]["frames"][0] == _frame(line_b)

    del b, c
    segs = _ours(history._snapshot())["segments"]
    if core() == "compiled":  # freed: cached, fully inactive, until empty_cache() releases them
        assert [(s["total_size"], s["allocated_size"], s["requested_size"], [b["state"] for b in s["blocks"]])
                for s in sorted(segs, key=lambda s: s["total_size"])] == [
            (1024, 0, 0, ["inactive"]), (MIB_3, 0, 0, ["inactive"])]
        torch.neuron.empty_cache()
        trace = history._snapshot()["device_traces"][0]
        assert [(e["action"], e["size"]) for e in trace[-2:]] == [("segment_free", 1024), ("segment_free", MIB_3)]
        assert _ours(history._snapshot())["segments"] == []
    else:
        assert segs == []


def test_memory_viz_reads_the_snapshot() -> None:
    snap, (_, line_b, line_c), b, c = _allocate_free_reuse()
    ours = _ours(snap)
    stats = _memory_viz.segsum(ours)
    assert "segments: 2\ntotal_reserved: 3.0MiB\ntotal_allocated: 3.0MiB\ntotal_free: 24.0B (100.0% internal)\n" \
        in stats
    text = _memory_viz.trace(ours)
    assert "b = a[0:1000.0B]\nc = cudaMalloc(" in text and "del b # 1000.0B\n" in text
    # flamegraph lines, outermost frame first: the allocating line last, then the bytes
    lines = _memory_viz.segments(ours, format_flamegraph=lambda lines: lines).splitlines()
    small, large = (f"seg_{s['address']};" for s in sorted(ours["segments"], key=lambda s: s["total_size"]))
    stack, gaps = [line for line in lines if small in line]
    assert stack.startswith(f"stream_0;{small}active_allocated;")
    assert stack.endswith(f"test_memory_snapshot.py:{line_c}:_allocate_free_reuse 1000")
    assert gaps == f"stream_0;{small}active_allocated;<gaps> 24"  # the size class's rounding waste
    [big] = [line for line in lines if large in line]
    assert big.endswith(f"test_memory_snapshot.py:{line_b}:_allocate_free_reuse {MIB_3}")
    by_site = _memory_viz.memory(ours, format_flamegraph=lambda lines: lines).splitlines()
    assert "stream_0;active_allocated;<gaps> 24" in by_site and len(by_site) == 3
    for plot, title in ((_memory_viz.trace_plot, "Active Memory Timeline"),
                        (_memory_viz.segment_plot, "Allocator State History")):
        html = plot(snap)
        assert html.lstrip().startswith("<!DOCTYPE html>") and repr(title) in html


_DUMP = """
import json, torch, neuron_lab
torch.neuron.memory._record_memory_history()
a = torch.empty(1000, dtype=torch.uint8, device="neuron")
b = torch.empty(3 << 20, dtype=torch.uint8, device="neuron")
torch.neuron.memory._dump_snapshot({path!r})
print(json.dumps("dumped"))
"""


def _viz(*args: str) -> str:
    """``python -m torch.cuda._memory_viz ARGS`` in a fresh interpreter that never imports neuron_lab."""
    proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_dump_snapshot_is_read_by_pytorchs_memory_viz_cli(run_python, tmp_path) -> None:
    path = tmp_path / "snap.pickle"
    assert run_python(_DUMP.format(path=str(path)), {}, timeout=300) == "dumped"
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert [(e["action"], e["size"]) for e in snap["device_traces"][0]] == [
        ("segment_alloc", 1024), ("alloc", KIB_1000), ("segment_alloc", MIB_3), ("alloc", MIB_3)]
    assert snap["device_traces"][0][1]["frames"] == [{"filename": "<string>", "line": 4, "name": "<module>"}]
    assert "segments: 2\ntotal_reserved: 3.0MiB\ntotal_allocated: 3.0MiB\n" in _viz("stats", str(path))
    html = tmp_path / "snap.html"
    _viz("trace_plot", str(path), "-o", str(html))
    assert "'Active Memory Timeline'" in html.read_text()


def test_turning_history_off_stops_it_and_clears_it() -> None:
    from torch.neuron.memory import _record_memory_history, _snapshot  # importable, as torch.cuda.memory is

    _record_memory_history()
    x = _empty(1001)
    assert [e["action"] for e in _snapshot()["device_traces"][0]] == ["segment_alloc", "alloc"]
    _record_memory_history(None)
    y = _empty(1001)
    snap = _snapshot()
    assert all(trace == [] for trace in snap["device_traces"])
    # the allocator's state is still there, with the stack of x, recorded while history was on
    mine = [s["blocks"][0] for s in snap["segments"] if s["requested_size"] == 1001]
    assert sorted(len(b["frames"]) > 0 for b in mine) == [False, True]
    del x, y


def test_legacy_bool_arguments() -> None:
    history._record_memory_history(True, trace_alloc_max_entries=10, trace_alloc_record_context=True)
    x = _empty(KIB_1000)
    [alloc] = [e for e in history._snapshot()["device_traces"][0] if e["action"] == "alloc"]
    assert [f["name"] for f in alloc["frames"][:2]] == ["_empty", "test_legacy_bool_arguments"]
    history._record_memory_history(False)
    assert history._snapshot()["device_traces"][0] == []
    del x


def test_state_keeps_one_entry_and_max_entries_keeps_the_newest() -> None:
    history._record_memory_history("state")
    keep = [_empty(KIB_1000), _empty(2000)]
    assert [(e["action"], e["size"]) for e in history._snapshot()["device_traces"][0]] == [("alloc", 2000)]
    history._record_memory_history(max_entries=3, clear_history=True)
    keep += [_empty(n) for n in (10_000, 20_000, 30_000)]
    assert [(e["action"], e["size"]) for e in history._snapshot()["device_traces"][0]] == [
        ("alloc", 20_000), ("segment_alloc", 32768 if core() == "compiled" else 30_208), ("alloc", 30_000)]
    del keep


def test_context_none_records_no_stacks() -> None:
    history._record_memory_history(context=None)
    x = _empty(KIB_1000)
    snap = _ours(history._snapshot())
    assert [e["frames"] for e in snap["device_traces"][0]] == [[], []]
    assert [(s["frames"], s["blocks"][0]["frames"]) for s in snap["segments"]] == [([], [])]
    del x


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"enabled": "bogus"}, "expected state to be 'state', 'all', or None"),
    ({"context": "bogus"}, "expected context to be 'state', 'alloc', 'all', or None"),
    ({"stacks": "cpp"}, "expected stacks to be 'python', or 'all'"),
])
def test_bad_arguments_raise_cudas_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        history._record_memory_history(**kwargs)
    x = _empty(KIB_1000)  # nothing changed: history is still off
    assert all(trace == [] for trace in history._snapshot()["device_traces"])
    del x


_OOM = """
import json, torch, neuron_lab
torch.neuron.memory._record_memory_history()
try:
    torch.empty(2 << 20, dtype=torch.uint8, device="neuron")
except torch.OutOfMemoryError:
    pass
print(json.dumps(torch.neuron.memory._snapshot()["device_traces"][0]))
"""


def test_an_oom_is_recorded_with_the_free_bytes(run_python) -> None:
    [oom] = run_python(_OOM, {"NEURON_LAB_DEVICE_MEMORY": "1MiB"}, timeout=300)
    assert {k: oom[k] for k in ("action", "size", "device_free")} == {"action": "oom", "size": 2 << 20,
                                                                       "device_free": 1 << 20}
    assert oom["frames"][0] == {"filename": "<string>", "line": 5, "name": "<module>"}


def test_skip_actions_leaves_them_out_and_torch_2_13s_other_arguments_are_accepted() -> None:
    history._record_memory_history(skip_actions=["segment_alloc", "segment_free", "free_requested"],
                                   compile_context=True, global_record_annotations=True, clear_history=True)
    t = _empty(KIB_1000)
    del t
    assert [e["action"] for e in history._snapshot()["device_traces"][0]] == ["alloc", "free_completed"]
    with pytest.raises(RuntimeError, match="skip_actions: unknown action 'malloc'"):
        history._record_memory_history(skip_actions=["malloc"])
