"""``torch.compile(backend="neuron")`` on the emulator: aot_autograd graphs, TorchNeuron's semantics and metrics.

Dynamo hands over a torch-level graph; aot_autograd turns it into aten inference, forward and
backward graphs on ``neuron`` fake tensors, which is what TorchNeuron's own backend sees. Each
graph is then lowered one of two ways (:func:`set_lowering`, else ``NEURON_LAB_COMPILE_LOWERING``):

- ``eager`` (default): the aten graph runs op by op on the device, through the emulator's fallback,
  so every op inside a compiled graph is counted, with eager's numerics, and none is a CPU fallback:
  TorchNeuron lowers a graph as a whole. What the emulator must show about a compile is the graph
  structure and whether TorchNeuron could lower it (:mod:`unlowered`), not host speed; and a compile
  costs aot_autograd's tracing only, no code generation.
- ``inductor``: a copy of the graph with ``device=neuron`` rewritten to ``cpu`` is compiled
  by host Inductor on first call, on zero-copy CPU aliases of the device inputs, and its results are
  adopted back as device tensors: about CPU-Inductor speed, after an Inductor compile (seconds to
  minutes). A graph Inductor cannot lower runs eagerly instead, with the reason in its metrics record.

As in TorchNeuron, ``dynamic=True`` is rejected, a non-default ``mode`` warns and is ignored, and
each graph appends a ``get_dynamo_metrics()`` record, plus the nodes TorchNeuron would not lower. A graph
with such a node fails its setup, as TorchNeuron's: it raises, or with
``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0`` runs eagerly, its ops then falling back one by one as in eager mode.
Shapes that vary between calls recompile per shape, as the 2.33 docs say (the April 2026 source rejected any
symbolic graph).

Dynamo and aot_autograd load at the first compile, not with this module: ``%load_ext`` reads and sets the
lowering here, and importing ``torch._dynamo`` costs about a second.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from neuron_lab import settings
from neuron_lab.backend import compile_failures
from neuron_lab.backend.emulator import attention, runtime, unlowered
from neuron_lab.backend.emulator.compile_metrics import NeuronCompilationMetrics
from neuron_lab.backend.emulator.graph_lines import located_forward

Tensor = torch.Tensor
_LOWERING = settings.env("NEURON_LAB_COMPILE_LOWERING")
LOWERING_ENV, LOWERINGS = _LOWERING.name, _LOWERING.choices
DYNAMIC_ERROR = ('torch.compile(backend="neuron") does not support dynamic=True: the Neuron backend compiles '
                 "static shapes. Leave dynamic unset (or False); shapes that vary between calls recompile per shape.")
_CPU = torch.device("cpu")
_nth: Counter[str] = Counter()  # graphs compiled per "{model}_{aot_id}_{type}" prefix
_chosen: str | None = None  # set_lowering's choice; None: the environment variable decides
_model_name: str | None = None  # torch_neuronx.neuron_dynamo_backend.set_model_name's


def lowering() -> str:
    """The lowering the next compiled graph gets: the one chosen in-process, else the env var's, else eager (a bad
    env var's value is warned about when the emulator installs)."""
    return _chosen or _LOWERING.choice()[0]


def set_lowering(name: str | None) -> None:
    """The lowering of graphs compiled from now on (``%config NeuronLab.compile_lowering``); None: the env var's."""
    global _chosen
    if name is not None and name not in LOWERINGS:
        raise ValueError(f"unknown compile lowering {name!r}: expected one of {', '.join(LOWERINGS)}")
    _chosen = name


def set_model_name(name: str | None) -> None:
    """Name the graphs compiled from now on (``graph_name`` = ``{name}_{aot id}_{type}_{n}``), as
    TorchNeuron's ``set_model_name`` names its NEFFs; None: the compiled module's class name again."""
    global _model_name
    _model_name = name


def get_model_name() -> str:
    """The name :func:`set_model_name` set, else ``"model_default"`` as TorchNeuron says."""
    return _model_name or "model_default"


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
                  options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The emulator's Dynamo backend: check TorchNeuron's options, then compile through aot_autograd."""
    from torch._dynamo.backends.common import aot_autograd

    if not torch._dynamo.config.assume_static_by_default and _is_symbolic(gm, example_inputs):
        raise RuntimeError(DYNAMIC_ERROR)
    if mode not in (None, "default"):
        warnings.warn(f"Neuron backend does not support mode='{mode}', falling back to default mode.",
                      UserWarning, stacklevel=2)
    options = options or {}
    model_name = str(options.get("model_name") or _model_name or _module_name() or "model")
    chosen = lowering()

    def compiler(graph_type: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
        def compile_one(g: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
            return _compile_aten_graph(g, inputs, graph_type, model_name, chosen)

        return compile_one

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                        inference_compiler=compiler("inference"))(gm, example_inputs)


def _is_symbolic(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    values = list(example_inputs) + [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
    return any(_has_symbols(v) for v in values)


def _has_symbols(v: Any) -> bool:
    if isinstance(v, torch.SymInt):
        return True
    return isinstance(v, Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape)


def _module_name() -> str | None:
    """Class name of the nn.Module whose code is being compiled: the nearest ``self`` up the stack.

    Dynamo compiles a module's ``forward`` (or a resume function after a graph break) called from
    that module's ``__call__``, so its frame is on the stack with the module as ``self``.
    """
    frame = sys._getframe(1)
    while frame is not None:
        s = frame.f_locals.get("self")
        if isinstance(s, torch.nn.Module) and not isinstance(s, torch.fx.GraphModule):
            return type(getattr(s, "_orig_mod", s)).__name__
        frame = frame.f_back
    return None


def _compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], graph_type: str,
                        model_name: str, lowering: str) -> Callable[..., Any]:
    """Record one aten graph's metrics and return its boxed runner."""
    from torch._dynamo.utils import counters
    from torch._functorch._aot_autograd.logging_utils import get_aot_compilation_context

    t0 = time.perf_counter_ns()
    rt = runtime.get()
    context = get_aot_compilation_context()[0]
    aot_id = context[0].split("_", 1)[0] if context else "0"
    prefix = f"{model_name}_{aot_id}_{graph_type}"
    nth = _nth[prefix]
    _nth[prefix] += 1
    metrics = NeuronCompilationMetrics(
        graph_id=_graph_id(gm, example_inputs), graph_name=f"{prefix}_{nth}", model_name=model_name,
        graph_node_count=len(gm.graph.nodes), timestamp=time.time(), graph_type=graph_type, lowering=lowering,
        unlowered=unlowered.unlowered_nodes(gm, rt.coverage.classify, _on_device))
    if metrics.unlowered:
        return _failed(gm, example_inputs, metrics, rt)
    graph = NeuronGraph(gm, example_inputs, metrics, rt.bridge)
    fx_us = (time.perf_counter_ns() - t0) // 1000
    metrics.torch_neuronx_fx_passes_us = metrics.torch_neuronx_compile_us = fx_us
    rt.dynamo_metrics.append(metrics)
    counters["neuron"]["compiled_graphs"] += 1
    return graph


def _failed(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], metrics: NeuronCompilationMetrics,
            rt: runtime.Runtime) -> Callable[..., Any]:
    """A graph TorchNeuron would not lower: raise its setup error, or (fallback execution allowed) log it as
    TorchNeuron does and run the graph eagerly, its ops reported as eager ones."""
    why = unlowered.describe(metrics.unlowered)
    fallback = not unlowered.disable_fallback_execution()
    graph = NeuronGraph(gm, example_inputs, metrics, rt.bridge) if fallback else None
    metrics.lowering, metrics.lowering_reason, metrics.fallback_execution = "failed", why, fallback
    rt.dynamo_metrics.append(metrics)  # the report says which graph failed, and why, whichever way it ends
    if graph is None:
        raise RuntimeError(compile_failures.SETUP_FAILED + why)
    log = logging.getLogger(compile_failures.LOGGER)
    log.error(compile_failures.EXECUTION_FAILED + why)
    log.warning(compile_failures.EAGER_MESSAGE)
    graph.eager, graph.lowered = True, False
    return graph


def _graph_id(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """A cache key as TorchNeuron's: the graph's code and its input signature."""
    sig = [(tuple(x.shape), tuple(x.stride()), str(x.dtype)) if isinstance(x, Tensor) else repr(x)
           for x in example_inputs]
    return hashlib.sha256(f"{gm.code}\n{sig}".encode()).hexdigest()[:16]


def _on_device(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_on_device(x) for x in v)
    return isinstance(v, Tensor) and v.device.type != "cpu"


def _ops_in(gm: torch.fx.GraphModule) -> set[str]:
    return {n.target.name() for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


def _no_host_kernel(gm: torch.fx.GraphModule) -> list[str]:
    """Ops with a device kernel but no CPU one (custom ``neuron`` ops): host Inductor cannot run them."""
    has = torch._C._dispatch_has_computed_kernel_for_dispatch_key
    return sorted(name for name in _ops_in(gm) if not has(name, "CPU"))


def _fused_attention(gm: torch.fx.GraphModule) -> list[str]:
    """The fused attention ops in ``gm`` (:data:`attention.FUSED_OPS`)."""
    return sorted(_ops_in(gm).intersection(attention.FUSED_OPS))


_VIEW, _RESHAPE = torch.ops.aten.view.default, torch.ops.aten.reshape.default


def _host_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` that computes on the host: ``device=neuron`` becomes ``cpu``, device constants host aliases.

    The neuron fake-tensor metadata is dropped so Inductor re-derives it from the real CPU inputs. Its
    strides can differ from the ones the graph was traced with (attention's ``[2,2,32,16]`` with strides
    ``(1024,32,1,64)`` in gpt2 and t5), so a ``view`` the trace allowed may not be a view on the host:
    the copy says ``reshape``, which is the same view where one exists and a copy where none does (the
    graph is functional, so nothing observes the difference).
    """
    graph = torch.fx.Graph()
    env = graph.graph_copy(gm.graph, {})
    graph.output(env)

    def to_cpu(a: Any) -> Any:
        return _CPU if isinstance(a, torch.device) and a.type != "cpu" else a

    for n in graph.nodes:
        if n.target is _VIEW:
            n.target = _RESHAPE
        n.args = torch.fx.node.map_aggregate(n.args, to_cpu)
        n.kwargs = torch.fx.node.map_aggregate(n.kwargs, to_cpu)
        for key in ("val", "tensor_meta", "example_value"):
            n.meta.pop(key, None)
    host = torch.fx.GraphModule(gm, graph)
    bridge = runtime.get().bridge
    for n in graph.find_nodes(op="get_attr"):
        owner, _, attr = n.target.rpartition(".")
        mod = host.get_submodule(owner) if owner else host
        value = getattr(mod, attr)
        if isinstance(value, Tensor) and not value.is_cpu:
            setattr(mod, attr, bridge.to_host(value))  # gm keeps the device tensor, and its memory, alive
    return host


def _signature(host_args: list[Any]) -> tuple:
    return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, Tensor) else a for a in host_args)


class NeuronGraph:
    """A compiled aten graph, called with aot_autograd's boxed convention (one list, cleared on entry).

    Lowered by host Inductor on first call, once per input signature when the graph has symbolic
    shapes; on an Inductor failure it runs the device graph eagerly from then on and says why in
    its metrics record.
    """

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], metrics: NeuronCompilationMetrics,
                 bridge) -> None:
        self._boxed_call = True  # an instance attribute: functools.wraps (Dynamo's disable) copies only __dict__
        self.gm = gm
        self.metrics = metrics
        self._bridge = bridge
        self._lowered: dict[tuple | None, Callable[..., Any]] = {}
        self._dynamic = any(_has_symbols(x) for x in example_inputs)
        outputs = gm.graph.output_node().args[0]
        self._out_on_device = tuple(_on_device(o.meta.get("val")) if isinstance(o, torch.fx.Node) else False
                                    for o in outputs)
        self.eager = metrics.lowering == "eager"
        self.lowered = True  # TorchNeuron lowered it: its ops run on the device, none falls back
        self._run_eagerly: Callable[..., Any] | None = None
        missing = [] if self.eager else _no_host_kernel(gm)
        fused = [] if self.eager else _fused_attention(gm)
        if missing:
            self._use_eager(f"no CPU kernel for {', '.join(missing)}, so host Inductor cannot run it")
        elif fused:
            self._use_eager(f"{', '.join(fused)}: its philox seed and offset are TorchNeuron's, not the meta "
                            "function's scalars that host Inductor checks")

    def _use_eager(self, reason: str) -> None:
        self.eager = True
        self.metrics.lowering = "eager"
        self.metrics.lowering_reason = reason
        warnings.warn(f"torch.compile(backend='neuron'): graph {self.metrics.graph_name} runs eagerly on the "
                      f"device: {reason}", UserWarning, stacklevel=3)

    def __call__(self, args: list[Any]) -> list[Any]:
        inputs = list(args)  # keeps the device tensors, whose memory the host aliases borrow, alive
        args.clear()
        if self.eager:
            return self._eager(inputs)
        to_host = self._bridge.to_host
        host = [to_host(a) if isinstance(a, Tensor) and not a.is_cpu else a for a in inputs]
        key = _signature(host) if self._dynamic else None
        fn = self._lowered.get(key)
        if fn is None:
            fn = self._lower(host, key)
            if fn is None:
                return self._eager(inputs)
        from_host = self._bridge.from_host
        index = next((a.device.index for a in inputs if isinstance(a, Tensor) and not a.is_cpu), None)
        return [from_host(r, index) if dev and r is not None else r
                for r, dev in zip(fn(*host), self._out_on_device)]

    def _eager(self, inputs: list[Any]) -> Any:
        """Op by op on the device, each op at its user line (``gm.forward`` where none is known).

        Not ``gm(...)``: a module call here is no user's, and compile mode must not compile it again.
        """
        if self._run_eagerly is None:
            try:
                self._run_eagerly = located_forward(self.gm) or self.gm.forward
            except Exception:  # the lines are a nicety: the graph runs as generated rather than not at all
                self._run_eagerly = self.gm.forward
        if not self.lowered:
            return self._run_eagerly(*inputs)
        with runtime.get().compiled_graph():
            return self._run_eagerly(*inputs)

    def _lower(self, host: list[Any], key: tuple | None) -> Callable[..., Any] | None:
        import torch._inductor

        t0 = time.perf_counter_ns()
        try:
            # The first call of an aot graph runs under an analysis dispatch mode; Inductor must not see it.
            with _disable_current_modes(), torch.no_grad():
                fn = torch._inductor.compile(_host_graph(self.gm), host)
        except Exception as e:  # any lowering failure means: run the graph as it is
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self._use_eager(f"host Inductor failed: {type(e).__name__}: {first[:300]}")
            return None
        us = (time.perf_counter_ns() - t0) // 1000
        self.metrics.torch_neuronx_lower_us += us
        self.metrics.torch_neuronx_compile_us += us
        self._lowered[key] = fn
        return fn
