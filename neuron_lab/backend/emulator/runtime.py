"""The emulator's one per-process state, whichever core runs it.

Both cores offer the same pieces, typed by the protocols of ``core_api``: device memory (``memory``), op
aggregates (``recorder``), device selection and generators (``devices``), zero-copy host views (``bridge``),
the profiler's device lanes (``trace``); the op coverage is the runtime's own.
Everything above reads these and never asks which core it got, except to say so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from neuron_lab.kinds import FALLBACK, HOST, NATIVE, NKI, POSSIBLE

if TYPE_CHECKING:
    from neuron_lab.backend.coverage import Coverage
    from neuron_lab.backend.coverage.conditions import ArgRule
    from neuron_lab.backend.emulator.compile_metrics import NeuronCompilationMetrics
    from neuron_lab.backend.emulator.core_api import DeviceMemory, DeviceSelection, DeviceTrace, HostViews
    from neuron_lab.backend.emulator.topology import Topology
    from neuron_lab.backend.events import OpRecorder

COMPILED, PYTHON = "compiled", "python"

# Hot functional overloads sent to the core's fallback directly, as a generated backend registers kernels:
# one call instead of the structured wrapper's empty + `.out` pair. Composites whose result differs from the
# CPU kernel's (group_norm on a channels-last input) go there too, and composites TorchNeuron registers a kernel for
# (_grouped_mm), so the call is reported, and its argument conditions tested, as TorchNeuron receives it.
DIRECT_OPS = (
    "add.Tensor", "add_.Tensor", "add.Scalar", "sub.Tensor", "sub_.Tensor", "mul.Tensor", "mul_.Tensor",
    "mul.Scalar", "mul_.Scalar", "div.Tensor", "div_.Tensor", "div.Scalar", "neg", "sqrt", "rsqrt",
    "exp", "pow.Tensor_Scalar",
    "mm", "addmm", "bmm", "baddbmm", "relu", "threshold_backward", "gelu", "gelu_backward", "silu", "silu_backward",
    "tanh", "tanh_backward", "sigmoid", "sigmoid_backward", "sum.dim_IntList", "mean.dim", "sum", "mse_loss",
    "mse_loss_backward", "native_dropout", "native_dropout_backward", "tril", "_log_softmax",
    "_log_softmax_backward_data", "_softmax", "_softmax_backward_data",
    "nll_loss_forward", "nll_loss_backward", "addcmul_", "addcdiv_", "lerp_.Scalar", "clone", "fill_.Scalar",
    "zero_", "where.self", "native_layer_norm", "native_layer_norm_backward", "embedding_dense_backward",
    "eq.Scalar", "ne.Scalar", "gt.Scalar", "lt.Scalar", "maximum", "minimum", "clamp", "cat", "stack", "index.Tensor",
    "_fused_adamw_", "_fused_adam_", "_fused_sgd_", "native_group_norm", "native_group_norm_backward", "histc",
    "_grouped_mm",
)


# The coverage read from TorchNeuron's source (tools/derive_coverage.py): its native ops are the ops it registers
# a kernel for.
SOURCE_COVERAGE = "torchneuron-src-2026-04"


def direct_ops() -> list[str]:
    """:data:`DIRECT_OPS` plus the ``_foreach_*`` overloads TorchNeuron registers a kernel for (one host kernel per
    list, as on the device: ``_foreach_add``, ``_sub``, ``_mul``, ``_div``, ``_norm`` and their in-place forms).
    Every other ``_foreach_`` op has a composite kernel that the dispatcher runs before a backend's fallback: on
    TorchNeuron it calls its per-tensor op once a tensor (``_foreach_sqrt``: ``sqrt``), and those calls are what
    TorchNeuron receives, runs and reports, so here too."""
    import torch

    from neuron_lab.backend import coverage

    source = coverage.load(SOURCE_COVERAGE)
    foreach = [n.removeprefix("aten::") for n in torch._C._dispatch_get_all_op_names()
               if n.startswith("aten::_foreach_") and source.classify(n.split(".")[0])[0] == NATIVE]
    return [*DIRECT_OPS, *foreach]


class NoDeviceTrace:
    """The pure-Python core puts no device lanes into torch.profiler: there is nothing to add work to."""

    def active(self) -> bool:
        return False

    def clock(self) -> int:
        return 0

    def collective(self, name: str, device: int, nbytes: int, start_ns: int, end_ns: int) -> None:
        pass


@dataclass
class Runtime:
    core: str  # COMPILED | PYTHON
    core_reason: str  # why this core runs
    topology: Topology
    memory: DeviceMemory  # memory.Allocator | cpp_core.CoreMemory
    recorder: OpRecorder
    devices: DeviceSelection  # python_core.PythonDevices | cpp_core.CoreDevices
    bridge: HostViews  # host.HostBridge | cpp_core.CoreBridge
    coverage: Coverage
    on_coverage: Callable[[Coverage], None]
    libraries: list[Any] = field(default_factory=list)  # torch.library registrations, kept alive
    dynamo_metrics: list[NeuronCompilationMetrics] = field(default_factory=list)  # get_dynamo_metrics() records
    problems: list[str] = field(default_factory=list)  # configuration trouble, for doctor and the banner
    emulate_downcast: bool = True  # TorchNeuron's 64-bit rule: float64 ops compute in float32 (=0: exact)
    nki_ops: dict[str, str] = field(default_factory=dict)  # custom ops registered by torch_neuronx.nki_op -> reason
    trace: DeviceTrace = field(default_factory=NoDeviceTrace)  # cpp_core.CoreTrace: work added to the device lanes
    in_graph: int = 0  # compiled graphs running now (nested): their ops are lowered, none falls back

    def classify(self, name: str, dtypes: frozenset[str]) -> tuple[str, str, tuple[ArgRule, ...]]:
        """How a call of ``name`` on device tensors of ``dtypes`` is reported: an NKI kernel, else as the coverage
        says; inside a compiled graph TorchNeuron lowered, a CPU fallback or host op runs on the device, and an op
        that may fall back in eager mode is the graph's too (its evidence is about eager dispatch, not lowering).
        Last, the argument conditions the cores test each call against (only for an op otherwise native)."""
        reason = self.nki_ops.get(name)
        if reason is not None:
            return NKI, reason, ()
        kind, reason = self.coverage.classify(name, dtypes)
        if self.in_graph and kind in (FALLBACK, HOST, POSSIBLE):
            return NATIVE, "", ()
        return kind, reason, self.coverage.arg_rules(name) if kind == NATIVE and not self.in_graph else ()

    @contextmanager
    def compiled_graph(self) -> Iterator[None]:
        """Run a lowered graph's ops: the cores forget the kinds they cached on entering and leaving it."""
        self.in_graph += 1
        if self.in_graph == 1:
            self.on_coverage(self.coverage)
        try:
            yield
        finally:
            self.in_graph -= 1
            if not self.in_graph:
                self.on_coverage(self.coverage)

    def set_coverage(self, coverage: Coverage) -> None:
        self.coverage = coverage
        self.on_coverage(coverage)


_runtime: Runtime | None = None


def get() -> Runtime:
    if _runtime is None:
        raise RuntimeError("the neuron emulator is not installed in this process")
    return _runtime


def set_runtime(rt: Runtime) -> None:
    global _runtime
    _runtime = rt


def installed() -> bool:
    return _runtime is not None
