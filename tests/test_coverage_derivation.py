"""tools/derive_coverage.py reads TorchNeuron's PrivateUse1 registrations from source and writes a coverage profile.

The synthetic tree below holds a few lines of every registration form the script reads (written for this test,
not copied from TorchNeuron), plus decoys it must ignore: commented-out registrations, docstring examples, other
dispatch keys, and modules TorchNeuron's auto-registration never imports. The bundled profile derived from the
April 2026 source is checked for its provenance and for the ops that matter most.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_lab.backend import coverage

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "derive_coverage.py"
HEAD = "0123456789abcdef0123456789abcdef01234567"
BUNDLED = "torchneuron-src-2026-04"

CPP = """\
#include <torch/library.h>
namespace demo {
static const std::unordered_set<std::string> QUIET_VIEWS = {
    "aten::transpose",  // comment with "aten::not_a_view"
    "aten::view",
};
static const std::unordered_set<std::string> UNUSED_SET = {"aten::never_looked_up"};

void demo_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto name = c10::toString(op.schema().operator_name());
  if (QUIET_VIEWS.find(name) == QUIET_VIEWS.end()) { warn(name); }
  at::native::cpu_fallback(op, stack);
}

at::Tensor sort_on_host(const at::Tensor& self, bool stable, int64_t dim, bool descending) {
  auto cpu = self.to(at::kCPU);
  return cpu.argsort(stable, dim, descending).to(self.device());
}

at::Tensor view_k(const at::Tensor& self, at::IntArrayRef size) { return alias(self, size); }
}  // namespace demo

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &demo::empty_k);
  m.impl("view", TORCH_FN(demo::view_k));
  // m.impl("copy_", &demo::copy_k);
  /* m.impl("abs", &demo::abs_k); */
  m.impl("argsort.stable", &demo::sort_on_host);
  m.impl("set_.source_Storage", &demo::set_k);
  m.impl("set_", &demo::set_empty_k);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&demo::demo_fallback>());
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("contiguous", &demo::contiguous_k); }

TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("sin", &demo::sin_cpu); }

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &demo::choose);
}
"""

PY_INIT = '''\
import torch

lib = torch.library.Library("aten", "IMPL")


def _register():
    lib.impl("gather", gather_k, "PrivateUse1")
    lib.impl("gather.out", gather_k, "PrivateUse1")
    lib.impl("index.Tensor", index_k, dispatch_key="PrivateUse1")
    lib.impl("rms_norm", rms_k, "AutogradPrivateUse1")
    lib.impl("_attention_backward", meta_k, "Meta")
'''

XLA_OPS = '''\
from torch_neuronx.python_ops.auto_registration import neuron_binary_op, neuron_op, set_wrapper_override


@neuron_binary_op("aten::mul.Tensor")
@neuron_binary_op("aten::mul_")
class MulImpl:
    def can_handle(self, *args):
        return all(a.device.type == "neuron" for a in args)


@neuron_op("aten::_demo_never")
class NeverImpl:
    def can_handle(self, *args):
        """Always declines, so the CPU fallback runs it."""
        return False


@neuron_op(aten_name="aten::_fused_adamw_")
class AdamImpl:
    pass


set_wrapper_override("aten::_fused_adamw_.tensor_lr", lambda *a: None)
'''

MLIR_OPS = '''\
"""Unary ops. Example: @register_aten("aten::cos") registers cos (a docstring, not a registration)."""

from ..operation_registry import register_aten


@register_aten(["aten::sqrt", "aten::sqrt.out"])
def torch_sqrt(x, out=None):
    return x.sqrt()


@register_aten("aten::exp", static_argnums=(1,))
def torch_exp(x):
    return x.exp()


# @register_aten(["aten::vstack"])
def torch_vstack(xs):
    return xs
'''

HOST = '''\
import torch


def register_host_ops(aten_lib):
    pairs = [
        ("linalg_qr", torch.ops.aten.linalg_qr.default),
        ("_linalg_det", torch.ops.aten._linalg_det.default),
    ]
    for name, op in pairs:
        aten_lib.impl(name, run_on_cpu(op), "PrivateUse1")
'''

AUTOCAST = '''\
import torch


class Autocast:
    def _get_target_dtype(self, dtype):
        if dtype == torch.float64:
            return torch.float32
        if dtype == torch.int64:
            return torch.int32
        return dtype
'''

SKIPPED = {  # modules TorchNeuron's discover_all_implementations never imports
    "torch_neuronx/python_ops/legacy/relu_xla.py": 'from x import neuron_unary_op\n\n\n@neuron_unary_op("aten::relu")\n'
                                                   "class ReluImpl:\n    pass\n",
    "torch_neuronx/python_ops/jax/ops.py": 'from x import register_aten\n\n\n@register_aten("aten::tanh")\n'
                                           "def tanh(x):\n    return x\n",
}

FILES = {
    "torch_neuronx/csrc/core/Demo.cpp": CPP,
    "torch_neuronx/python_ops/__init__.py": PY_INIT,
    "torch_neuronx/python_ops/xla_ops/mul_xla.py": XLA_OPS,
    "torch_neuronx/python_ops/torch_mlir/ops/unary.py": MLIR_OPS,
    "torch_neuronx/python_ops/host_ops.py": HOST,
    "torch_neuronx/python_ops/dtype_autocast.py": AUTOCAST,
    **SKIPPED,
}

EXPECTED_KINDS = {
    "aten::_copy_from": "native",  # PYTORCH_SERVED
    "aten::_demo_never": "fallback",
    "aten::_fused_adamw": "native",
    "aten::_fused_sdp_choice": "native",
    "aten::_linalg_det": "host",
    "aten::_unsafe_view": "native",  # PYTORCH_SERVED
    "aten::argsort": "host",
    "aten::contiguous": "native",
    "aten::empty": "native",
    "aten::exp": "native",
    "aten::gather": "native",
    "aten::index": "native",
    "aten::linalg_qr": "host",
    "aten::mul": "native",
    "aten::rms_norm": "native",
    "aten::set": "native",
    "aten::sqrt": "native",
    "aten::transpose": "native",
    "aten::view": "native",
}

EXPECTED_COUNTS = {  # form -> (registrations, distinct profile keys)
    "cpp_privateuse1": (5, 4),  # empty, view, argsort, set_ x2
    "autograd_privateuse1": (2, 2),  # contiguous (C++), rms_norm (Python)
    "cpp_view_whitelist": (2, 2),
    "cpp_dispatch_stub": (1, 1),
    "py_library_impl": (3, 2),  # gather, gather.out, index.Tensor
    "neuron_op": (5, 3),  # mul.Tensor, mul_, _demo_never, _fused_adamw_ (decorator and wrapper override)
    "register_aten": (3, 2),
    "py_host": (2, 2),
}


def derive(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(src), "--commit", HEAD, "--date", "2026-04-21",
                           "-o", str(out), *extra], capture_output=True, text=True, timeout=60)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for rel, text in FILES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(textwrap.dedent(text))
    commits = {rel: ("a" * 40 if "csrc" in rel else "b" * 40) for rel in FILES}
    (src / "PROVENANCE.json").write_text(json.dumps(
        {"repo": "demo/torchneuron", "files": {rel: {"commit": c} for rel, c in commits.items()}}))
    return src


def test_every_registration_form_is_read_and_decoys_are_not(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "derived.json"
    proc = derive(tree, out)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())

    assert {k: v["kind"] for k, v in data["ops"].items()} == EXPECTED_KINDS
    assert list(data["ops"]) == sorted(data["ops"])
    assert data["name"] == "torchneuron-src-2026-04" and data["date"] == "2026-04-21"
    assert data["default"] == {"kind": "fallback", "reason": (
        "TorchNeuron has no device kernel for this op: its CPU fallback copies the inputs to the CPU, runs the op "
        "there and copies the result back.\nsource: not registered by TorchNeuron's backend at 0123456: the boxed CPU "
        "fallback runs it"), "evidence": "not registered"}  # a sentence for a newcomer, then where it comes from
    # every rule names its evidence, so every reason a report shows ends with its confidence
    assert {k: v["evidence"] for k, v in data["ops"].items()} == {
        k: {"native": "registered", "host": "host kernel", "fallback": "shape gate"}[kind]
        for k, kind in EXPECTED_KINDS.items()}
    assert data["downcast_dtypes"] == ["float64", "int64"]

    prov = data["provenance"]
    assert prov["repo"] == "demo/torchneuron" and prov["commit"] == HEAD
    assert prov["file_commits"] == sorted({HEAD, "a" * 40, "b" * 40})
    assert {f: (c["registrations"], c["ops"]) for f, c in prov["counts"].items()} == EXPECTED_COUNTS
    assert prov["ops_by_kind"] == {"native": 15, "host": 3, "fallback": 1}
    assert prov["pytorch_served"] == 2 and prov["files_scanned"] == len(FILES)
    assert prov["downcast"] == {"from": "python_ops/dtype_autocast.py",
                                "map": {"float64": "float32", "int64": "int32"}}

    reasons = {k: v["reason"] for k, v in data["ops"].items()}
    assert "overloads: set_, set_.source_Storage" in reasons["aten::set"]
    assert "sort_on_host copies the input to the host" in reasons["aten::argsort"]
    assert "NeverImpl.can_handle always returns False" in reasons["aten::_demo_never"]
    assert "@register_aten" in reasons["aten::sqrt"] and "python_ops/torch_mlir/ops/unary.py" in reasons["aten::sqrt"]
    assert "view whitelist" in reasons["aten::transpose"]

    with pytest.warns(coverage.CoverageWarning, match=r"'aten::_demo_never'$"):  # the tree's invented op
        profile = coverage.from_dict(data)  # the schema accepts it
    assert profile.classify("aten::mul_", frozenset({"float32"}))[0] == "native"
    assert profile.classify("aten::cos", frozenset({"float32"}))[0] == "fallback"


def test_options_and_errors(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "named.json"
    assert derive(tree, out, "--name", "demo-profile", "--repo", "someone/else").returncode == 0
    data = json.loads(out.read_text())
    assert data["name"] == "demo-profile" and data["provenance"]["repo"] == "someone/else"
    bad = subprocess.run([sys.executable, str(SCRIPT), str(tree), "--commit", HEAD, "--date", "April", "-o",
                          str(out)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not YYYY-MM-DD" in bad.stderr


def test_keys_match_the_loader() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import derive_coverage
    finally:
        sys.path.remove(str(SCRIPT.parent))
    for name in ("add_.Tensor", "aten::add.out", "aten::__and__.Tensor", "_fused_adamw_.tensor_lr", "set_",
                 "empty.memory_format", "aten::index.Tensor_out"):
        assert derive_coverage.op_key(name) == coverage._key("aten::" + name.removeprefix("aten::").split(".")[0])


# ---------------------------------------------------------------- the bundled derived profile

METADATA_OPS = ("aten::view", "aten::as_strided", "aten::as_strided_", "aten::_reshape_alias", "aten::empty",
                "aten::empty_strided", "aten::resize_", "aten::set_", "aten::_copy_from", "aten::_copy_from_and_resize",
                "aten::copy_", "aten::_to_copy", "aten::_local_scalar_dense", "aten::unfold", "aten::alias",
                "aten::view_as_real", "aten::view_as_complex", "aten::_unsafe_view", "aten::transpose",
                "aten::detach", "aten::clone", "aten::contiguous")


def test_bundled_derived_profile() -> None:
    assert BUNDLED in coverage.bundled()
    p = coverage.load(BUNDLED)
    assert p.name == BUNDLED and p.date == "2026-04-21"
    assert p.default == "fallback" and p.default_reason.endswith(
        "\nsource: not registered by TorchNeuron's backend at 98154b8: the boxed CPU fallback runs it")
    prov = p.provenance
    assert prov["repo"] == "parmoham-aws/test-repo-parmoham"
    assert prov["commit"] == "98154b867aa24562a3213e520d9ad7fd41032291"
    assert set(prov["counts"]) == {"cpp_privateuse1", "autograd_privateuse1", "cpp_view_whitelist",
                                   "cpp_dispatch_stub", "py_library_impl", "neuron_op", "register_aten", "py_host"}
    assert prov["ops_by_kind"]["native"] + prov["ops_by_kind"]["host"] + prov["ops_by_kind"]["fallback"] == len(p.ops)

    f32 = frozenset({"float32"})
    for op in ("aten::addmm", "aten::mm", "aten::bmm", "aten::_softmax", "aten::native_layer_norm", "aten::gelu",
               "aten::embedding", "aten::add", "aten::mul_", "aten::_fused_adamw_", "aten::_scaled_dot_product_"
               "fused_attention_overrideable", *METADATA_OPS):
        assert p.classify(op, f32)[0] == "native", op
    for op in ("aten::linalg_qr", "aten::_linalg_svd", "aten::triangular_solve", "aten::select_backward"):
        assert p.classify(op, f32)[0] == "host", op
    for op in ("aten::acos", "aten::baddbmm", "aten::max_pool2d_with_indices", "aten::native_batch_norm",
               "aten::_test_serialization_subcmul"):
        assert p.classify(op, f32)[0] == "fallback", op
    assert p.downcast_dtypes == frozenset({"float64", "int64"})


@pytest.mark.skipif(not os.environ.get("NEURON_LAB_TN_SRC"), reason="set NEURON_LAB_TN_SRC to TorchNeuron's source")
def test_bundled_profile_regenerates(tmp_path: Path) -> None:
    out = tmp_path / "regen.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), os.environ["NEURON_LAB_TN_SRC"], "--commit",
                           "98154b867aa24562a3213e520d9ad7fd41032291", "--date", "2026-04-21", "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    bundled = ROOT / "neuron_lab" / "backend" / "coverage" / f"{BUNDLED}.json"
    assert json.loads(out.read_text()) == json.loads(bundled.read_text())
