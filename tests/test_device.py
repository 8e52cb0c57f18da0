"""The emulated `neuron` device behaves like a PyTorch accelerator: tensors, torch.neuron, torch.accelerator,
autocast, RNG, device checks, pinned memory and module moves, as user code written for CUDA expects."""

from __future__ import annotations

import copy
import re
import time
import weakref

import pytest
import torch
from conftest import core
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import neuron_lab.backend as nb
from neuron_lab.backend.emulator import runtime

N = torch.neuron.device_count()  # 4 on the compiled core (a trn2.3xlarge), 1 on the pure-Python core
# The first index past the last device: the compiled core says PyTorch's words, the Python core names its limit.
NO_DEVICE = (f"Invalid device id {N}" if core() == "compiled" else
             "neuron:1 is not available: the neuron emulator's pure-Python core has one device (neuron:0)")
SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, neuron:0 and cpu!"


# -- tensors on the device ---------------------------------------------------------------------
def test_device_spellings_create_neuron_tensors() -> None:
    dev = torch.device("neuron")
    assert (dev.type, dev.index) == ("neuron", None)
    made = [torch.ones(2).to("neuron"), torch.ones(2).to(dev), torch.randn(2, device="neuron"),
            torch.zeros(2, device="neuron:0"), torch.ones(2).neuron(), torch.tensor([1.0, 2.0], device="neuron")]
    for t in made:
        assert t.device == torch.device("neuron", 0)
        assert t.is_neuron and not t.is_cpu
    assert torch.ones(2, device="neuron").type() == "torch.neuron.FloatTensor"


def test_repr_names_the_device_and_cpu_round_trips() -> None:
    x = torch.arange(3.0, device="neuron")
    assert repr(x) == "tensor([0., 1., 2.], device='neuron:0')"
    back = x.cpu()
    assert back.device.type == "cpu" and back.tolist() == [0.0, 1.0, 2.0]
    assert x.sum().item() == 3.0


def test_numpy_raises_the_device_error() -> None:
    with pytest.raises(TypeError, match=r"^can't convert neuron:0 device type tensor to numpy\. "
                                        r"Use Tensor\.cpu\(\) to copy the tensor to host memory first\.$"):
        torch.ones(2, device="neuron").numpy()


def test_module_neuron_moves_parameters_and_buffers() -> None:
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).neuron()
    assert {t.device for t in [*m.parameters(), *m.buffers()]} == {torch.device("neuron", 0)}


@pytest.mark.parametrize("make", [
    lambda: torch.randn(2, device=f"neuron:{N}"),
    lambda: torch.empty(2, device=f"neuron:{N}"),
    lambda: torch.ones(2).to(f"neuron:{N}"),
    lambda: torch.ones(2).neuron(N),
    lambda: nn.Linear(2, 2).to(f"neuron:{N}"),
], ids=["randn", "empty", "to", "tensor.neuron(N)", "module.to"])
def test_a_device_past_the_last_is_a_clear_error(make) -> None:
    with pytest.raises(RuntimeError, match=re.escape(NO_DEVICE)):
        make()


# -- torch.neuron --------------------------------------------------------------------------------
def test_torch_neuron_device_surface() -> None:
    n = torch.neuron
    assert n.is_available() and n.device_count() == N and n.current_device() == 0
    n.set_device(0)
    n.set_device("neuron:0")
    with n.device(0):
        assert n.current_device() == 0
    with pytest.raises(ValueError, match=f"Invalid device id {N}"):
        n.set_device(N)
    with pytest.raises(ValueError, match=f"Invalid device id {N}"):
        n.device(f"neuron:{N}")
    n.synchronize()
    n.synchronize("neuron:0")
    assert n.get_device_name() == n.get_device_name(0) == "neuron:0"
    props = n.get_device_properties(0)
    assert "neuron" in props.name
    assert props.total_memory == nb.active().capacity() == 24 * 1024**3
    assert n.get_amp_supported_dtype() == [torch.float32, torch.float16, torch.bfloat16]
    assert n.is_bf16_supported() is True
    assert torch.get_device_module("neuron") is n


def test_torch_neuron_seed_functions() -> None:
    n = torch.neuron
    n.manual_seed(123)
    assert n.initial_seed() == 123
    a = torch.randn(4, device="neuron")
    n.manual_seed_all(123)
    assert n.initial_seed() == 123
    assert torch.equal(a.cpu(), torch.randn(4, device="neuron").cpu())
    n.seed()
    assert n.initial_seed() != 123


def test_memory_stats_have_torchneuron_nested_keys() -> None:
    stats = torch.neuron.memory_stats()  # torch_neuronx/memory.py:28-54, csrc/core/NeuronBindings.cpp:1239-1260
    assert set(stats) == {"allocated_bytes", "reserved_bytes", "active_bytes", "num_alloc_retries", "num_ooms",
                          "num_tensor_frees", "allocation_requests"}
    for group in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        assert set(stats[group]) == {"current", "peak", "allocated", "freed"}
        for metric in ("current", "peak", "allocated", "freed"):
            assert isinstance(stats[group][metric], int)
    assert isinstance(stats["num_ooms"], int) and isinstance(stats["num_alloc_retries"], int)
    assert stats["allocated_bytes"]["current"] == torch.neuron.memory_allocated()
    assert stats["reserved_bytes"]["current"] == torch.neuron.memory_reserved()
    kept = torch.empty(1024, device="neuron")  # an allocation that fits retries nothing (earlier tests may have)
    assert torch.neuron.memory_stats()["num_alloc_retries"] == stats["num_alloc_retries"]
    del kept


def test_memory_functions_agree_and_reset_peak() -> None:
    n = torch.neuron
    n.empty_cache()
    base = n.memory_allocated()
    n.reset_peak_memory_stats()
    assert n.max_memory_allocated() == base
    big = torch.empty(1000, device="neuron")  # 4000 bytes: 8 blocks of 512 (Python core), the 4 KiB class (compiled)
    assert n.memory_allocated() == base + 4000
    block = 512 if core() == "python" else 256
    assert n.memory_reserved() >= n.memory_allocated() and n.memory_reserved() % block == 0
    del big
    assert n.memory_allocated() == base
    assert n.max_memory_allocated() == base + 4000
    assert n.max_memory_reserved() >= base + 4096
    n.reset_peak_memory_stats()
    assert n.max_memory_allocated() == base


def test_memory_summary_is_a_table_of_the_stats() -> None:
    keep = torch.empty(256, device="neuron")  # noqa: F841  (1 KiB live while the summary is taken)
    text = torch.neuron.memory_summary()
    lines = text.splitlines()
    assert {len(line) for line in lines} == {81}
    assert "neuron (emulated) memory summary, device 0" in text
    assert lines[5].startswith("| Allocated memory ")
    assert "capacity: 24.00 GiB" in text
    assert "Allocations" not in torch.neuron.memory_summary(abbreviated=True)


# -- torch.accelerator -------------------------------------------------------------------------------
def test_torch_accelerator_sees_neuron() -> None:
    acc = torch.accelerator
    assert acc.is_available() and acc.current_accelerator() == torch.device("neuron")
    assert acc.device_count() == N and acc.current_device_index() == 0
    acc.synchronize()
    acc.synchronize(0)
    stream = acc.current_stream()
    assert stream.device == torch.device("neuron", 0) and stream.query()


def test_torch_accelerator_memory_agrees_with_torch_neuron() -> None:
    acc, n = torch.accelerator, torch.neuron
    x = torch.empty(300, device="neuron")
    assert acc.memory_allocated() == n.memory_allocated()
    assert acc.memory_reserved() == n.memory_reserved()
    flat = dict(acc.memory_stats())  # CUDA's flat keys: torch.accelerator's own convention
    assert flat == dict(runtime.get().memory.stats(0))
    nested = n.memory_stats()  # TorchNeuron's shape, of the same counters
    assert flat["allocated_bytes.all.current"] == nested["allocated_bytes"]["current"]
    assert flat["reserved_bytes.all.peak"] == nested["reserved_bytes"]["peak"]
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == n.max_memory_allocated() == n.memory_allocated()
    before = n.memory_allocated()
    del x
    assert acc.memory_allocated() == before - 1200
    free, total = acc.get_memory_info()
    assert total == n.get_device_properties().total_memory
    # free is what no segment holds: the compiled core's cache keeps freed segments reserved, as CUDA's does
    assert free == total - (n.memory_reserved() if core() == "compiled" else n.memory_allocated())
    assert acc.max_memory_reserved() == n.max_memory_reserved()


# -- streams and events: one in-order queue ----------------------------------------------------------
def test_events_time_work_recorded_between_them() -> None:
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    x = torch.randn(64, 64, device="neuron") @ torch.randn(64, 64, device="neuron")
    time.sleep(0.02)
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms >= 19.5  # the host slept 20 ms between the records
    assert end.elapsed_time(end) == 0.0
    assert x.shape == (64, 64)


def test_event_timing_errors_like_cuda() -> None:
    plain = torch.neuron.Event()
    plain.record()
    with pytest.raises(RuntimeError, match=r"Both events must be created with argument 'enable_timing=True'\."):
        plain.elapsed_time(plain)
    timed, unrecorded = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    timed.record()
    with pytest.raises(RuntimeError, match="Both events must be recorded"):
        timed.elapsed_time(unrecorded)


def test_streams_are_one_in_order_queue() -> None:
    s = torch.neuron.Stream()
    assert s.device == torch.device("neuron", 0)
    assert torch.neuron.current_stream() == torch.neuron.default_stream() == s
    with torch.neuron.stream(s):
        y = torch.ones(3, device="neuron") * 2
    ev = s.record_event()
    assert isinstance(ev, torch.neuron.Event) and ev.query()
    s.wait_event(ev)
    s.wait_stream(torch.neuron.current_stream())
    s.synchronize()
    assert s.query()
    assert y.cpu().tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match=f"Invalid device id {N}"):
        torch.neuron.Stream(device=f"neuron:{N}")  # keyword-only, as TorchNeuron's torch.neuron.Stream


# -- autocast --------------------------------------------------------------------------------------------
def test_autocast_bf16_casts_matmuls_down_and_keeps_fp32_ops() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(8, 3).to("neuron")
    x = torch.randn(4, 8, device="neuron", requires_grad=True)
    target = torch.zeros(4, 3, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = lin(x)
        m = x @ x.T
        sm = torch.softmax(y, -1)
        lsm = torch.log_softmax(y, -1)
        loss = nn.functional.mse_loss(y, target)
    assert (y.dtype, m.dtype) == (torch.bfloat16, torch.bfloat16)
    assert (sm.dtype, lsm.dtype, loss.dtype) == (torch.float32, torch.float32, torch.float32)
    ref = nn.functional.mse_loss(lin(x), target)
    assert abs(loss.item() - ref.item()) < 2e-2 * max(1.0, ref.item())
    (loss + sm.sum() + lsm.sum()).backward()
    assert x.grad.dtype == torch.float32 and lin.weight.grad.dtype == torch.float32
    assert x.grad.device.type == "neuron" and torch.isfinite(lin.weight.grad.cpu()).all()
    assert (lin(x) @ torch.ones(3, 1, device="neuron")).dtype == torch.float32  # autocast is over


def test_autocast_default_dtype_is_float16() -> None:
    assert torch.amp.is_autocast_available("neuron")
    assert torch.get_autocast_dtype("neuron") == torch.float16
    with torch.autocast("neuron"):
        assert (torch.ones(2, 2, device="neuron") @ torch.ones(2, 2, device="neuron")).dtype == torch.float16


# -- RNG ---------------------------------------------------------------------------------------------------
def _device_draws() -> list[torch.Tensor]:
    d = "neuron"
    return [t.cpu() for t in (torch.randn(5, device=d), torch.rand(5, device=d), torch.randint(0, 100, (5,), device=d),
                              torch.randperm(8, device=d), torch.empty(5, device=d).normal_(),
                              torch.empty(5, device=d).uniform_(), torch.bernoulli(torch.full((6,), 0.5, device=d)),
                              torch.multinomial(torch.ones(6, device=d), 3),
                              nn.functional.dropout(torch.ones(64, device=d), 0.5))]


def test_manual_seed_seeds_the_device_generator() -> None:
    torch.manual_seed(7)
    assert torch.neuron.initial_seed() == 7
    first = _device_draws()
    torch.manual_seed(7)
    again = _device_draws()
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    torch.manual_seed(8)
    assert not torch.equal(first[0], _device_draws()[0])


def test_cpu_and_device_streams_do_not_perturb_each_other() -> None:
    torch.manual_seed(0)
    dev_a = torch.randn(4, device="neuron").cpu(), torch.randn(4, device="neuron").cpu()
    torch.manual_seed(0)
    first = torch.randn(4, device="neuron").cpu()
    cpu_between = torch.randn(100)
    second = torch.randn(4, device="neuron").cpu()
    assert torch.equal(dev_a[0], first) and torch.equal(dev_a[1], second)

    torch.manual_seed(0)
    cpu_ref = torch.randn(6)
    torch.manual_seed(0)
    nn.functional.dropout(torch.ones(32, device="neuron"), 0.5)  # dropout borrows the CPU generator's slot
    torch.randn(3, device="neuron")
    assert torch.equal(torch.randn(6), cpu_ref)
    assert cpu_between.shape == (100,)


def test_rng_state_round_trips() -> None:
    torch.manual_seed(1)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = _device_draws()
    torch.neuron.set_rng_state(state)
    b = _device_draws()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(torch.neuron.get_rng_state("neuron:0"), torch.neuron.get_rng_state())

    torch.manual_seed(2)
    with torch.random.fork_rng(device_type="neuron"):
        inside = torch.randn(3, device="neuron").cpu()
    assert torch.equal(torch.randn(3, device="neuron").cpu(), inside)


def test_dropout_module_is_reproducible_under_seed() -> None:
    m = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.3)).to("neuron").train()
    x = torch.ones(8, 16, device="neuron")
    torch.manual_seed(5)
    a = m(x).cpu()
    torch.manual_seed(5)
    torch.rand(10)  # a CPU draw in between
    b = m(x).cpu()
    assert torch.equal(a, b)
    zeros = int((a == 0).sum())
    assert 0 < zeros < a.numel()


# -- device checks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [
    lambda x, c: x + c,  # direct kernel
    lambda x, c: c * x,  # direct kernel, CPU first
    lambda x, c: torch.cat([x, c]),  # direct kernel over a list
    lambda x, c: torch.gather(x, 0, c.long()),  # boxed fallback
    lambda x, c: torch.ones(3, 3, device="neuron") @ c,  # boxed fallback (addmv)
    lambda x, c: torch.sin(x, out=c),  # boxed fallback, CPU out=
    lambda x, c: torch.atan2(x, c),  # structured op
    lambda x, c: torch.hypot(c, x),  # structured op
], ids=["add", "mul-cpu-first", "cat", "gather", "matvec", "sin-out", "atan2", "hypot"])
def test_mixed_devices_raise_pytorchs_error(op) -> None:
    with pytest.raises(RuntimeError, match=re.escape(SAME_DEVICE)):
        op(torch.ones(3, device="neuron"), torch.ones(3))


def test_zero_dim_cpu_scalars_are_allowed() -> None:
    x = torch.tensor([1.0, -2.0, 3.0], device="neuron")
    s = torch.tensor(2.0)
    assert (x + s).cpu().tolist() == [3.0, 0.0, 5.0]
    assert (x * s).device.type == "neuron"
    assert torch.where(x > 0, x, torch.tensor(0.0)).cpu().tolist() == [1.0, 0.0, 3.0]
    assert torch.allclose(torch.atan2(x, torch.tensor(1.0)).cpu(), torch.atan2(x.cpu(), torch.tensor(1.0)))


def test_cpu_index_tensors_index_like_on_cuda() -> None:
    ref = torch.arange(6.0)
    x = ref.to("neuron")
    idx, mask = torch.tensor([0, 4]), torch.tensor([True, False, True, False, False, True])
    assert x[idx].cpu().tolist() == [0.0, 4.0]
    assert x[mask].cpu().tolist() == [0.0, 2.0, 5.0]
    x[idx] = 9.0
    ref[idx] = 9.0
    x[mask] = torch.tensor(-1.0)
    ref[mask] = torch.tensor(-1.0)
    x.index_put_((torch.tensor([1, 1]),), torch.tensor(2.0), accumulate=True)
    ref.index_put_((torch.tensor([1, 1]),), torch.tensor(2.0), accumulate=True)
    assert x.cpu().tolist() == ref.tolist() == [-1.0, 5.0, -1.0, 3.0, 9.0, -1.0]


# -- pinned memory and non_blocking copies -----------------------------------------------------------------
def test_pin_memory_marks_a_pinned_copy() -> None:
    t = torch.arange(4.0)
    assert not t.is_pinned()
    p = t.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu" and torch.equal(p, t)
    assert p.pin_memory() is p
    assert not torch.ones(2, device="neuron").is_pinned()


def test_dataloader_pin_memory_batches_move_non_blocking() -> None:
    ds = TensorDataset(torch.randn(10, 3), torch.arange(10))
    seen = 0
    for xb, yb in DataLoader(ds, batch_size=4, pin_memory=True):
        assert xb.is_pinned() and yb.is_pinned() and xb.device.type == "cpu"
        xd, yd = xb.to("neuron", non_blocking=True), yb.to("neuron", non_blocking=True)
        assert xd.device.type == "neuron" and torch.equal(xd.cpu(), xb) and torch.equal(yd.cpu(), yb)
        seen += len(yb)
    assert seen == 10


def test_non_blocking_copies_both_directions_and_count_bytes() -> None:
    be = nb.active()
    be.clear_op_tracking()
    host = torch.arange(100.0).pin_memory()
    dev = host.to("neuron", non_blocking=True)
    back = dev.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(back, host)
    buf = torch.empty(100).pin_memory()
    buf.copy_(dev * 2, non_blocking=True)
    dev.copy_(buf, non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(dev.cpu(), host * 2)
    assert be.transfer_bytes() == (800, 1200)  # 2 uploads, 3 downloads of 400 bytes each


# -- module moves keep Parameter identity -------------------------------------------------------------------
class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids))


def _tied_groups(module: nn.Module) -> list[tuple[str, ...]]:
    """Parameter names grouped by the Parameter object they share (groups of two or more)."""
    by_id: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [tuple(names) for names in by_id.values() if len(names) > 1]


def test_module_to_keeps_parameter_identity_and_ties() -> None:
    torch.manual_seed(0)
    m = _Tied()
    before = _tied_groups(m)
    assert before == [("emb.weight", "out.weight")]
    w = m.emb.weight
    m.to("neuron")
    assert m.emb.weight is w and m.out.weight is w and w.device.type == "neuron"
    assert _tied_groups(m) == before
    m.cpu()
    assert m.emb.weight is w and m.out.weight is w and w.device.type == "cpu"
    m.neuron()
    m.to(torch.device("neuron"), torch.float16)
    assert m.out.weight is w and w.dtype == torch.float16 and _tied_groups(m) == before


def test_tie_check_detects_a_split() -> None:
    """The check the test above relies on sees a tie that is gone."""
    m = _Tied()
    m.out.weight = nn.Parameter(m.emb.weight.detach().clone())
    assert _tied_groups(m) == []


def test_optimizer_made_before_the_move_updates_moved_params() -> None:
    torch.manual_seed(0)
    m = _Tied()
    ref = copy.deepcopy(m)
    ids = torch.tensor([1, 2, 3])
    opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    m(ids).sum().backward()  # a grad on CPU before the move moves with its parameter
    m.to("neuron")
    assert m.emb.weight.grad.device.type == "neuron"
    opt.step()
    ref(ids).sum().backward()
    ref_opt.step()
    assert opt.state[m.emb.weight]["momentum_buffer"].device.type == "neuron"
    assert torch.equal(m.emb.weight.detach().cpu(), ref.emb.weight.detach())
    assert m.out.weight is m.emb.weight


def test_move_keeps_weakrefs_attributes_and_hooks_like_set_data() -> None:
    m = nn.Linear(2, 2)
    w = m.weight
    ref = weakref.ref(w)  # the workbench, dynamo and users hold weak references to parameters
    w.tag = "kept"
    fired: list[str] = []
    w.register_hook(lambda g: fired.append("grad hook"))
    w.register_post_accumulate_grad_hook(lambda p: fired.append("post-accumulate hook"))
    m.to("neuron")
    assert ref() is w and m.weight is w and w.device.type == "neuron" and w.tag == "kept"
    m(torch.ones(1, 2, device="neuron")).sum().backward()
    assert fired == ["grad hook", "post-accumulate hook"]
    grad = w.grad
    m.cpu()
    assert m.weight is w and w.grad is grad and grad.device.type == "cpu" and w.tag == "kept"


def test_backward_through_a_graph_from_before_the_move_is_refused() -> None:
    m = nn.Linear(2, 2)
    loss = m(torch.ones(1, 2)).sum()
    m.to("neuron")
    with pytest.raises(RuntimeError, match="run forward again after the move"):
        loss.backward()


def test_lazy_modules_materialize_on_the_device() -> None:
    m = nn.LazyLinear(3).to("neuron")
    y = m(torch.ones(2, 4, device="neuron"))
    assert y.shape == (2, 3) and m.weight.shape == (3, 4) and m.weight.device.type == "neuron"
