"""Which ops of a compiled graph TorchNeuron's compile path would not lower, and what it then does.

TorchNeuron lowers a graph as a whole (aot_autograd with its own decomposition table, then torch-mlir to
StableHLO, tnx ``neuron_dynamo_backend/backend.py``): a compiled graph has no per-op CPU fallback. An op it
cannot lower fails the whole graph's setup ("Neuron backend NEFF execution setup failed with unexpected error"),
which raises, or, with ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0``, runs the original graph eagerly (the
2.33 env-vars page; the April source logs "Execution failed" then "Falling back to original GraphModule
execution"). No source lists the ops torch-mlir lowers, so the prediction is: an op the coverage profile
says falls back to the CPU, unless TorchNeuron's compile decomposition table rewrites it first.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from typing import Any

import torch

from neuron_lab import frames, settings
from neuron_lab.kinds import FALLBACK

_FALLBACK_EXECUTION = settings.env("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION")

# Ops TorchNeuron's compile decomposition table rewrites before lowering (tnx neuron_dynamo_backend/
# decompositions.py at 98154b8: its get_decompositions list and its own registrations), by schema name.
DECOMPOSED = frozenset({
    "aten::logsumexp", "aten::squeeze", "aten::binary_cross_entropy", "aten::native_batch_norm_backward",
    "aten::nansum", "aten::addr", "aten::_unsafe_index", "aten::_unsafe_index_put", "aten::split",
    "aten::split_with_sizes", "aten::unbind", "aten::replication_pad1d", "aten::replication_pad2d",
    "aten::replication_pad3d", "aten::reflection_pad1d", "aten::reflection_pad2d", "aten::reflection_pad3d",
    "aten::embedding", "aten::native_layer_norm_backward", "aten::nll_loss_backward", "aten::clamp_min",
    "aten::clamp_max", "aten::linear_backward", "aten::_fused_rms_norm", "aten::_fused_rms_norm_backward",
    "aten::fill", "aten::index_add", "aten::native_dropout_backward", "aten::gelu_backward",
    "aten::threshold_backward", "aten::_log_softmax_backward_data", "aten::_softmax_backward_data",
    "aten::select_backward", "aten::slice_backward", "aten::softplus_backward", "aten::index_select_backward",
    "aten::col2im", "aten::lerp", "aten::elu", "aten::elu_backward", "aten::silu", "aten::as_strided",
    "aten::topk", "aten::_scaled_dot_product_fused_attention_overrideable",
})


def disable_fallback_execution() -> bool:
    """``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION``: on unless set to 0 (2.33's default; the April source's was 0)."""
    return _FALLBACK_EXECUTION.raw() is None or _FALLBACK_EXECUTION.flag()


def _line(node: torch.fx.Node) -> tuple[str, int]:
    """The innermost non-internal line of a node's stack trace: where the op came from ("", 0: unknown)."""
    last = ("", 0)
    for part in (node.meta.get("stack_trace") or "").split('File "')[1:]:
        name, _, rest = part.partition('", line ')
        digits = rest.split(",", 1)[0].split("\n", 1)[0].strip()
        if digits.isdigit() and not frames.is_internal(name):
            last = (name, int(digits))
    return last


def unlowered_nodes(gm: torch.fx.GraphModule, classify: Callable[[str, frozenset[str]], tuple[str, str]],
                    on_device: Callable[[Any], bool]) -> list[dict[str, Any]]:
    """The nodes TorchNeuron's compile path would not lower: ``{"node", "op", "file", "line", "reason"}`` each."""
    found = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        name = n.target._schema.name
        if name in DECOMPOSED:
            continue
        inputs = [a.meta.get("val") for a in n.all_input_nodes]
        dtypes = frozenset(str(v.dtype).removeprefix("torch.") for v in inputs if on_device(v))
        if not dtypes and not on_device(n.meta.get("val")):
            continue  # runs on the host in the original program too
        kind, reason = classify(name, dtypes)
        if kind == FALLBACK:
            file, line = _line(n)
            found.append({"node": n.name, "op": name, "file": file, "line": line, "reason": reason})
    return found


def describe(found: list[dict[str, Any]]) -> str:
    """Why the graph fails, as the setup error's text: each op and the line it came from."""
    def one(f: dict[str, Any]) -> str:
        at = f" at {f['file']}:{f['line']} `{linecache.getline(f['file'], f['line']).strip()}`" if f["line"] else ""
        return f"{f['op']}{at}"

    return (f"no lowering to StableHLO for {', '.join(one(f) for f in found)} (a CPU fallback in eager mode; "
            "a compiled graph has none)")
