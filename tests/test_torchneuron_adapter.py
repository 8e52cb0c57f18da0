"""The real-TorchNeuron adapter (``neuron_lab.backend.torchneuron``) against the fake ``torch_neuronx``.

There is no Trainium here: everything below is verified only against the contract the fake in
``tests/fake_torchneuronx`` implements (TorchNeuron's documented op-tracking sets, ``torch.neuron``
memory calls on an asynchronous allocator, the ``neuron`` Dynamo entry point). One child process
runs a known program through the adapter and reports what it saw; the tests check it.
"""

from __future__ import annotations

import sys

import pytest
from fake_torchneuronx import SITE, run

from neuron_lab.backend.events import op_key

PROGRAM = """
import collections, json, sys, traceback
from importlib import metadata
sys.path.append(SITE)  # after site-packages: neuron_lab's entry points come first, so compile hands off
import torch
import torch_neuronx
import neuron_lab.backend.dynamo
from neuron_lab import backend
from neuron_lab.backend.torchneuron import TorchNeuronBackend

b = backend.active()
report = {"type": type(b).__name__, "kind": b.kind, "description": b.description, "summary": b.summary()}
report["runtime"] = [torch_neuronx.is_neuron_runtime_initialized()]  # after the adapter's summary: still not up

# -- a known program, observed while subscribed -----------------------------------------------
events = []

def on_event(event, args, kwargs):
    frames = [f for f in traceback.extract_stack()[:-1] if f.filename == __file__]
    events.append({"name": event.name, "kind": event.kind, "shapes": [list(s) for s in event.shapes],
                   "dtypes": list(event.dtypes), "line": frames[-1].lineno if frames else None})

b.clear_op_tracking()
unsubscribe = b.subscribe(on_event)
a = torch.randn(3, 4, device="neuron")
report["runtime"].append(torch_neuronx.is_neuron_runtime_initialized())  # the first device tensor started it
report["capacity_after_first_use"] = b.capacity()
w = torch.randn(3, 4, device="neuron", requires_grad=True)
for _ in range(3):
    c = torch.atan2(a, w)  # LINE:atan2
loss = (a * w).sum()
loss.backward()
d = torch.ones(2, dtype=torch.float64, device="neuron") * 2
h = a.cpu()
e = torch.arange(4.0).to("neuron")
value = loss.item()
unsubscribe()
unsubscribe()  # a second call is a no-op
report["events"] = events
report["stack_after"] = torch._C._len_torch_dispatch_stack()
report["device_fallback"] = sorted(b.get_fallback_ops())
report["device_executed"] = sorted(b.get_executed_ops())
report["stats"] = sorted([s.name, s.kind, s.count] for s in b.op_stats())
report["transfers"] = list(b.transfer_bytes())
report["values_ok"] = bool(torch.allclose(c.cpu(), torch.atan2(h, w.detach().cpu())))
report["dynamo_loaded_by_observing"] = "torch._dynamo" in sys.modules  # nothing compiled yet

# -- not subscribed: nothing observed, the device's own sets still fill --------------------------
b.clear_op_tracking()
torch.atan2(a, a)
report["idle_stats"] = len(b.op_stats())
report["idle_fallback"] = sorted(b.get_fallback_ops())

# -- two subscribers share one observer ----------------------------------------------------------
seen = collections.Counter()
u1 = b.subscribe(lambda ev, args, kwargs: seen.update(["first"]))
u2 = b.subscribe(lambda ev, args, kwargs: seen.update(["second"]))
torch.atan2(a, a)
u1()
torch.atan2(a, a)
report["stack_while_one_left"] = torch._C._len_torch_dispatch_stack()
u2()
torch.atan2(a, a)
report["seen"] = dict(seen)
report["stack_at_end"] = torch._C._len_torch_dispatch_stack()

# -- memory: every read synchronizes (the fake publishes statistics only at synchronize) --------
state = torch_neuronx._device.STATE
base = b.memory_allocated()
syncs = state.synchronize_calls
x = torch.empty(1024, device="neuron")  # 4096 bytes
report["memory"] = {
    "stale_without_sync": torch.neuron.memory_allocated() - base,
    "adapter": b.memory_allocated() - base,
    "stats_current": b.memory_stats()["allocated_bytes"]["current"] - base,
    "synchronized": state.synchronize_calls - syncs,
}
del x
report["memory"]["after_del"] = b.memory_allocated() - base
b.reset_peak_memory_stats()
y = torch.empty(2048, device="neuron")  # 8192 bytes
del y
report["memory"]["peak"] = b.max_memory_allocated() - base
report["memory"]["current_after_peak"] = b.memory_allocated() - base

# -- torch.compile(backend="neuron") reaches torch-neuronx's backend through ours ----------------
first = next(ep for ep in metadata.entry_points(group="torch_dynamo_backends") if ep.name == "neuron")
report["first_neuron_entry_point"] = first.value
report["hands_off_to"] = neuron_lab.backend.dynamo._other_neuron_backend().__module__
f = torch.compile(lambda p, q: torch.atan2(p, q) * 2 + 1, backend="neuron")
r = f(a, a)
report["compiled_device"] = str(r.device)
report["compiled_ok"] = bool(torch.allclose(r.cpu(), torch.atan2(h, h) * 2 + 1))
unsubscribe = b.subscribe(lambda ev, args, kwargs: None)
g = torch.compile(lambda p: torch.atan2(p, p) - 1, backend="neuron")
g(a)  # subscribing must not turn compilation into eager execution
unsubscribe()
report["dynamo_metrics"] = [{k: m[k] for k in ("graph_id", "graph_node_count")} for m in b.dynamo_metrics()]
report["lowering_us"] = b.lowering_us()
report["compile_lowerings"] = list(b.compile_lowerings)
try:
    b.set_compile_lowering("inductor")
except NotImplementedError as e:
    report["set_compile_lowering"] = str(e)
print(json.dumps(report))
"""


def _line_of(marker: str) -> int:
    """Line number in the written program: its first line (PROGRAM's leading newline) defines SITE."""
    return next(i for i, line in enumerate(PROGRAM.splitlines(), 1) if f"# {marker}" in line)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("adapter") / "program.py"
    path.write_text(f"SITE = {str(SITE)!r}" + PROGRAM)
    return run(argv=[sys.executable, str(path)]).json()


def test_observing_ops_loads_no_compiler(report):
    """The observer is a dispatch mode that torch would wrap in dynamo's ``disable``, importing dynamo (seconds) at a
    session's first op; ours takes it only once something loaded dynamo: a session that compiles nothing pays none."""
    assert report["dynamo_loaded_by_observing"] is False


def test_the_adapter_is_active_for_torch_neuronx(report):
    assert report["type"] == "TorchNeuronBackend" and report["kind"] == "torchneuron"
    assert report["description"] == "TorchNeuron (torch-neuronx 2.14.3.0)"
    assert report["summary"] == {"kind": "torchneuron", "version": "2.14.3.0", "devices": 1,
                                 "capacity": None, "coverage": None}  # None: read only once the runtime is up


def test_the_adapter_never_starts_the_neuron_runtime(report):
    """get_device_properties starts the runtime (tnx torch_neuronx/__init__.py:235-236): the capacity waits for the
    user's first device use, then is the device's."""
    assert report["runtime"] == [False, True]
    assert report["capacity_after_first_use"] == 24 * 1024**3


def test_fallback_and_executed_sets_are_torchneuronx_own(report):
    assert report["device_fallback"] == ["aten::atan2.out", "aten::normal_"]  # TorchNeuron names keep overloads
    # both copies (to and from the host) run the device's _to_copy kernel
    assert report["device_executed"] == ["aten::_to_copy", "aten::fill_", "aten::mul", "aten::sum"]


def test_subscribers_get_exact_counts(report):
    """The known program: 2 randn (normal_), 3 atan2, mul forward+backward+float64, sum, ones_like/ones, 2 copies."""
    assert report["stats"] == [
        ["aten::_to_copy", "native", 2],
        ["aten::atan2", "fallback", 3],
        ["aten::fill_", "downcast", 1],
        ["aten::fill_", "native", 2],
        ["aten::mul", "downcast", 1],
        ["aten::mul", "native", 3],
        ["aten::normal_", "fallback", 2],
        ["aten::sum", "native", 1],
    ]


def test_observer_agrees_with_the_device_sets(report):
    observed_fallback = {e["name"] for e in report["events"] if e["kind"] == "fallback"}
    observed_native = {e["name"] for e in report["events"] if e["kind"] == "native"}
    device = {op_key(n) for n in report["device_fallback"]}  # TorchNeuron's names keep the overload
    assert {op_key(n) for n in observed_fallback} == device
    assert not {op_key(n) for n in observed_native} & device


def test_events_carry_shapes_dtypes_and_the_call_site(report):
    atan2 = [e for e in report["events"] if e["name"] == "aten::atan2"]
    assert len(atan2) == 3
    for e in atan2:
        assert e["kind"] == "fallback"
        assert e["shapes"] == [[3, 4], [3, 4]] and e["dtypes"] == ["float32", "float32"]
        assert e["line"] == _line_of("LINE:atan2")


def test_transfer_bytes_are_counted(report):
    # host->device: arange(4.) as float32; device->host: a.cpu() (12 floats) and loss.item() (one float)
    assert report["transfers"] == [16, 48 + 4]
    assert report["values_ok"] is True


def test_observer_runs_only_while_someone_subscribes(report):
    assert report["stack_after"] == 0
    assert report["idle_stats"] == 0 and report["idle_fallback"] == ["aten::atan2.out"]
    assert report["seen"] == {"first": 1, "second": 2}
    assert report["stack_while_one_left"] == 1 and report["stack_at_end"] == 0


def test_memory_reads_synchronize_first(report):
    m = report["memory"]
    assert m["stale_without_sync"] == 0  # the fake's asynchronous allocator: not yet published
    assert m["adapter"] == 4096 and m["stats_current"] == 4096
    assert m["synchronized"] == 2  # one synchronize per adapter read
    assert m["after_del"] == 0
    assert m["peak"] == 8192 and m["current_after_peak"] == 0


def test_compile_hands_off_to_torch_neuronx_backend(report):
    assert report["first_neuron_entry_point"] == "neuron_lab.backend.dynamo:neuron_backend"
    assert report["hands_off_to"] == "torch_neuronx.neuron_dynamo_backend"
    assert report["compiled_device"] == "neuron:0" and report["compiled_ok"] is True
    # f: one input placeholder (f(a, a)), atan2, mul, add, output; g (compiled while subscribed): p, atan2, sub, output
    assert report["dynamo_metrics"] == [{"graph_id": "fake-0", "graph_node_count": 5},
                                        {"graph_id": "fake-1", "graph_node_count": 4}]


def test_lowering_time_comes_from_torch_neuronx_metrics(report):
    """What compile observers add as lazily lowered compile time: the fake records 1 ms per graph."""
    assert report["lowering_us"] == 2 * 1000


def test_the_compile_lowering_choice_is_the_emulators_and_torchneuron_refuses_it_clearly(report):
    assert report["compile_lowerings"] == []
    assert report["set_compile_lowering"] == (
        "the torchneuron backend compiles graphs with its own compiler; it has no lowering to choose "
        "(NeuronLab.compile_lowering applies to the emulator)")
