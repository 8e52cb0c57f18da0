"""TorchNeuron's 64-bit rule for int64 (issue 32): a device kernel computes int64 in int32, so values past int32
wrap, while copies keep int64 exactly (``python_ops/dtype_autocast.py``; copy_, _to_copy and contiguous are
registered with ``disable_dtype_autocast``). On both cores (``make test`` runs this file on each); the rule is the
default, ``NEURON_LAB_EMULATE_DOWNCAST=0`` keeps 64-bit exact."""

from __future__ import annotations

import pytest
import torch

import neuron_lab  # noqa: F401  (installs the backend)
import neuron_lab.backend as nb

BIG = 2**40 + 5  # 5 once wrapped to int32


def wrapped(v: int) -> int:
    return torch.tensor(v).to(torch.int32).item()


def test_a_value_past_int32_wraps_in_a_device_kernel() -> None:
    x = torch.tensor([BIG, 7]).to("neuron")
    y = x + 1
    assert y.dtype == torch.int64 and y.device.type == "neuron"
    assert y.cpu().tolist() == [6, 8]
    assert (x * 2).cpu().tolist() == [10, 14] and x.neg().cpu().tolist() == [-5, -7]
    assert (x // 2).cpu().tolist() == [2, 3]  # wrapped inputs give int32's answer


@pytest.mark.parametrize("copy", ["to", "cpu", "clone", "contiguous", "copy_", "index"])
def test_copies_keep_int64_exactly(copy: str) -> None:
    x = torch.tensor([[BIG, -BIG], [3, 4]]).to("neuron")
    got = {"to": lambda: x.to(torch.int64, copy=True), "cpu": lambda: x.cpu(), "clone": lambda: x.clone(),
           "contiguous": lambda: x.t().contiguous().t(),
           "copy_": lambda: torch.empty(2, 2, dtype=torch.int64, device="neuron").copy_(x),
           "index": lambda: x[0]}[copy]()  # a view: the device's bytes as they are
    assert got.cpu().tolist() == [[BIG, -BIG], [3, 4]][0 if copy == "index" else slice(None)]


def test_a_sum_past_int32_wraps() -> None:
    x = torch.full((4,), 2**30, dtype=torch.int64).to("neuron")
    assert x.sum().item() == wrapped(2**32) == 0
    assert x.cumsum(0).cpu().tolist() == [wrapped(2**30 * k) for k in range(1, 5)]
    assert torch.arange(6, device="neuron").sum().item() == 15  # what fits in int32 is untouched


def test_written_tensors_wrap_in_place() -> None:
    z = torch.full((3,), 2**31 - 1, dtype=torch.int64).to("neuron")
    z.add_(1)
    assert z.cpu().tolist() == [-(2**31)] * 3
    out = torch.empty(0, dtype=torch.int64, device="neuron")
    torch.mul(torch.tensor([BIG]).to("neuron"), 3, out=out)  # an out= the kernel grows
    assert out.cpu().tolist() == [15]


def test_a_cpu_fallback_computes_int64_exactly() -> None:
    """An op TorchNeuron runs on the CPU (random_: a fallback in the default coverage) keeps int64."""
    rt = nb.active()
    assert rt.coverage.classify("aten::random_", frozenset({"int64"}))[0] == "fallback"
    rt.clear_op_tracking()
    r = torch.randint(2**40, 2**40 + 10, (8,), device="neuron")
    assert "aten::random_" in rt.get_fallback_ops()
    assert all(2**40 <= v < 2**40 + 10 for v in r.cpu().tolist())


_SCRIPT = f"""
import json, torch
import neuron_lab.backend as nb
from neuron_lab.kinds import DOWNCAST
x = torch.tensor([{BIG}, 7]).to("neuron")
s = torch.full((4,), 2**30, dtype=torch.int64).to("neuron").sum()
print(json.dumps(dict(add=(x + 1).cpu().tolist(), sum=s.item(),
                      reason=next(r.reason for r in nb.active().op_stats(DOWNCAST) if r.name == "aten::add"))))
"""


def test_the_rule_is_the_default_and_its_downcast_row_says_values_past_int32_wrap(run_python) -> None:
    got = run_python(_SCRIPT, {"NEURON_LAB_EMULATE_DOWNCAST": ""})  # unset or empty: the default, on
    assert got["add"] == [6, 8] and got["sum"] == 0
    assert got["reason"] == ("int64 on TorchNeuron computes in 32-bit: int64 values beyond int32 wrap, copies keep "
                             "int64 (computed in 32-bit here; NEURON_LAB_EMULATE_DOWNCAST=0 keeps 64-bit exact)")


def test_exact_int64_as_a_setting(run_python) -> None:
    got = run_python(_SCRIPT, {"NEURON_LAB_EMULATE_DOWNCAST": "0"})
    assert got["add"] == [BIG + 1, 8] and got["sum"] == 2**32
    assert got["reason"].endswith("(reported only here; NEURON_LAB_EMULATE_DOWNCAST=1 computes float64 in float32 and "
                                  "int64 in int32)")


def test_a_0_dim_int64_alone_stays_exact() -> None:
    """TorchNeuron's autocast casts non-0-dim int64 tensors only (``dtype_autocast.py:52``); what its compiler does
    with a call on 0-dim ones alone no source says, so the emulator keeps them exact."""
    s = torch.tensor(BIG).to("neuron")
    assert (s + 1).item() == BIG + 1


def test_a_sparse_int64_result_is_refused_as_any_sparse_result() -> None:
    with pytest.raises(NotImplementedError, match="tensors are not supported on the neuron device"):
        torch.tensor([[0, BIG]]).to("neuron").to_sparse()
