"""Saving, loading, pickling and copying `neuron` tensors and modules, as checkpoints in user code do."""

from __future__ import annotations

import copy
import gc
import io
import pickle

import pytest
import torch
from torch import nn

DEVICE = torch.device("neuron", 0)


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                                   torch.bool, torch.float64])
def test_save_load_keeps_device_dtype_and_values(dtype) -> None:
    ref = (torch.arange(12) % 5).to(dtype).reshape(3, 4)
    t = ref.to("neuron")
    loaded = _round_trip(t)  # default weights_only=True
    assert loaded.device == DEVICE and loaded.dtype == dtype and loaded.shape == (3, 4)
    assert torch.equal(loaded.cpu(), ref)
    assert loaded.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_map_location_moves_between_cpu_and_neuron(tmp_path) -> None:
    t = torch.randn(2, 3, device="neuron")
    path = tmp_path / "t.pt"
    torch.save({"t": t}, path)
    on_cpu = torch.load(path, map_location="cpu")["t"]
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, t.cpu())
    assert torch.load(path, map_location=torch.device("neuron"))["t"].device == DEVICE
    torch.save({"t": t.cpu()}, path)
    up = torch.load(path, map_location="neuron")["t"]
    assert up.device == DEVICE and torch.equal(up.cpu(), t.cpu())
    assert torch.load(path, map_location={"cpu": "neuron:0"})["t"].device == DEVICE


def test_loaded_views_share_one_storage_and_count_once() -> None:
    base = torch.arange(100.0, device="neuron")
    buf = io.BytesIO()
    torch.save([base, base[10:20], base.view(10, 10).t()], buf)
    gc.collect()
    before = torch.neuron.memory_allocated()
    buf.seek(0)
    a, b, c = torch.load(buf)
    assert torch.neuron.memory_allocated() - before == 400
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
    a[10] = -1.0
    assert b[0].item() == -1.0 and c[0, 1].item() == -1.0
    del a, b, c
    assert torch.neuron.memory_allocated() == before


def test_pickle_round_trips_tensors_and_parameters() -> None:
    t = torch.arange(6.0, device="neuron").reshape(2, 3)
    back = pickle.loads(pickle.dumps(t))
    assert back.device == DEVICE and torch.equal(back.cpu(), t.cpu())
    p = nn.Parameter(torch.ones(3, device="neuron"))
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.device == DEVICE


def test_deepcopy_of_a_tensor_is_independent() -> None:
    t = torch.ones(4, device="neuron", requires_grad=True)
    c = copy.deepcopy(t)
    assert c.device == DEVICE and c.requires_grad and c is not t
    assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    with torch.no_grad():
        c.mul_(3)
    assert t.cpu().tolist() == [1.0] * 4 and c.detach().cpu().tolist() == [3.0] * 4


def test_deepcopy_of_a_module_keeps_device_and_ties() -> None:
    m = nn.Sequential(nn.Embedding(6, 4), nn.Linear(4, 6, bias=False), nn.BatchNorm1d(6))
    m[1].weight = m[0].weight
    m.to("neuron")
    c = copy.deepcopy(m)
    assert {t.device for t in [*c.parameters(), *c.buffers()]} == {DEVICE}
    assert c[1].weight is c[0].weight and c[0].weight is not m[0].weight
    for x, y in zip(m.state_dict().values(), c.state_dict().values()):
        assert torch.equal(x.cpu(), y.cpu())
    ids = torch.tensor([0, 1, 2, 3], device="neuron")
    assert torch.equal(m(ids).cpu(), c(ids).cpu())


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_state_dict_round_trips_between_devices() -> None:
    torch.manual_seed(0)
    dev = _net().to("neuron")
    dev(torch.randn(5, 3, device="neuron"))  # running stats now differ from the defaults
    cpu = _net()
    cpu.load_state_dict(dev.state_dict())
    for (k, x), y in zip(dev.state_dict().items(), cpu.state_dict().values()):
        assert y.device.type == "cpu" and torch.equal(x.cpu(), y), k
    again = _net().to("neuron")
    weight = again[0].weight
    again.load_state_dict(_round_trip(cpu.state_dict()))
    assert again[0].weight is weight and weight.device == DEVICE
    for x, y in zip(dev.state_dict().values(), again.state_dict().values()):
        assert y.device == DEVICE and torch.equal(x.cpu(), y.cpu())
    loaded = _round_trip(dev.state_dict())
    assert {t.device for t in loaded.values()} == {DEVICE}
    assert loaded["1.num_batches_tracked"].item() == 1


def test_optimizer_checkpoint_resumes_identically() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2).to("neuron")
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(8, 4, device="neuron")

    def step(m, o):
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()

    step(model, opt)
    ckpt = _round_trip({"model": model.state_dict(), "opt": opt.state_dict()})
    resumed = nn.Linear(4, 2).to("neuron")
    resumed.load_state_dict(ckpt["model"])
    resumed_opt = torch.optim.Adam(resumed.parameters(), lr=0.1)
    resumed_opt.load_state_dict(ckpt["opt"])
    assert resumed_opt.state[resumed.weight]["exp_avg"].device == DEVICE
    step(model, opt)
    step(resumed, resumed_opt)
    assert torch.equal(model.weight.detach().cpu(), resumed.weight.detach().cpu())


def test_whole_module_pickles_with_weights_only_false() -> None:
    m = _net().to("neuron").eval()
    back = _round_trip(m, weights_only=False)
    x = torch.randn(2, 3, device="neuron")
    assert next(back.parameters()).device == DEVICE
    assert torch.equal(back(x).cpu(), m(x).cpu())
