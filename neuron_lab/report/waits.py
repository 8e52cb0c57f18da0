"""A compile in progress in plain words: the one place the progress line, the live strip and the Compiles tab get
them from (``CompileTrace.compiling()`` is the data).

Dynamo names the code it compiles by its code object ("wrapper", "_fn", "torch_dynamo_resume_in_forward_at_7");
a researcher knows their module, their function, or the line that called it.
"""

from __future__ import annotations

from typing import Any

# Names of the code objects decorators and wrappers make: they say nothing about the user's code.
_GENERIC = frozenset({"wrapper", "wrapped", "inner", "fn", "func", "decorated", "_fn", "_call_impl", "__call__",
                      "<lambda>", "forward_call", "graph"})


def compiled_what(c: dict[str, Any]) -> str:
    """What is being compiled, as the user knows it: ``Net`` (a module call), ``forward``, else the call's line."""
    frame = c.get("frame") or ""
    name = frame.removesuffix(".__call__")
    if name and name not in _GENERIC and not name.startswith(("_", "torch_dynamo")):
        return name
    return f"the call at {c['site']}" if c.get("site") else "your code"


def compiling_step(c: dict[str, Any]) -> str:
    """What the compile does now, without the time: a line printed once per step (a terminal, ``neuron-lab run``)."""
    phase = c.get("phase")
    if phase == "loading":
        return loading_step(c.get("by"))
    what = compiled_what(c)
    if phase == "lowering":
        return f"compiling {what}: lowering graph {max(c['graphs'], 1)} to the neuron device"
    if phase == "backward":
        return f"compiling {what}: its backward graph, for the gradients"
    return f"compiling {what}: reading its Python code (graph {c['graphs'] + 1})"


LOADING = "loading PyTorch's compiler (once a session)"  # for a compile


def loading_step(by: str | None) -> str:
    """The loading line: a compile's (``by`` None), or a library's that imports the compiler for no compile of its
    own (torch.optim's constructors), which must not read as this cell compiling."""
    return LOADING if by is None else f"{by} imports PyTorch's compiler (once a session)"


# a shown line once its compile is over and the cell still runs: no stale step
COMPILED = "compiled; the cell is running"
LOADED = "compiler loaded; the cell is running"


def settled(loading: bool) -> str:
    """What a shown line says once the wait it showed is over while the cell runs on (``loading``: it was the
    compiler's loading)."""
    return LOADED if loading else COMPILED


def compiling_line(c: dict[str, Any]) -> str:
    """The step and the seconds it has taken so far, in whole seconds (a line that changes once a second)."""
    return f"{compiling_step(c)} — {int(c['elapsed_s'])} s"
