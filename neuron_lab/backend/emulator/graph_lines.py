"""An aten graph whose ops run at the lines their FX nodes came from (``node.meta["stack_trace"]``, which
aot_autograd keeps on forward and backward nodes): each op is called through one frame per line of its
node's stack, user and library lines alike (a cell's ``return torch.atan2(y, x)``, ``modeling_t5.py``'s
``self.SelfAttention(...)`` and the line inside it), each compiled under its own file.

Run op by op, a compiled graph's ops would otherwise sit in generated code (``<eval_with_key>``), and
whoever walks the stack for the line behind an op (neuron_lab's call sites, a traceback) would find only
the line that called the compiled function (dynamo's code for it reads as its ``def`` line). With this they
find the model's own lines, as in eager mode.
"""

from __future__ import annotations

import ast
import functools
import re
import types
from collections.abc import Callable
from typing import Any

import torch

from neuron_lab import frames

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')
Line = tuple[str, int, str]  # (file, line, function)


def _chain(stack_trace: str | None) -> tuple[Line, ...]:
    """The frames of a node's stack trace that are not internal (PyTorch, the standard library, neuron_lab),
    outermost first."""
    return tuple((m["file"], int(m["line"]), m["name"]) for m in _FRAME.finditer(stack_trace or "")
                 if not frames.is_internal(m["file"]))


@functools.lru_cache(maxsize=4096)  # chains repeat across a model's layers and its graphs
def _through(chain: tuple[Line, ...]) -> Callable[..., Any]:
    """``at(fn, args, kwargs)``: calls ``fn(*args, **kwargs)`` through one frame per line of ``chain``, each at its
    line of its file under its function's name (the arguments passed on as they are: a frame costs one plain call)."""
    (filename, line, name), rest = chain[0], chain[1:]
    call = "__next(__fn, a, k)" if rest else "__fn(*a, **k)"
    namespace: dict[str, Any] = {"__next": _through(rest) if rest else None}
    exec(compile("\n" * (line - 1) + f"def at(__fn, a, k): return {call}\n", filename, "exec"), namespace)
    fn = namespace["at"]
    names = {"co_name": name, **({"co_qualname": name} if hasattr(fn.__code__, "co_qualname") else {})}
    fn.__code__ = fn.__code__.replace(**names)
    return fn


def located_forward(gm: torch.fx.GraphModule) -> Callable[..., Any] | None:
    """``gm.forward`` with each op whose node has a stack trace called through its lines; None when no node has
    one (the line that called the compiled function is then the best there is)."""
    chains = {n.name: _chain(n.meta.get("stack_trace")) for n in gm.graph.nodes if n.op == "call_function"}
    if not any(chains.values()):
        return None
    tree = ast.parse(gm.code)
    fn = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "forward")
    namespace = dict(gm.forward.__func__.__globals__)
    helpers: dict[tuple[Line, ...], str] = {}
    for stmt in fn.body:
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                and all(k.arg is not None for k in stmt.value.keywords)):
            continue
        targets = [t.id for t in ast.walk(stmt) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)]
        chain = next((chains[t] for t in targets if chains.get(t)), None)
        if chain is None:
            continue
        name = helpers.get(chain)
        if name is None:
            name = helpers[chain] = f"_neuron_lab_at_{len(helpers)}"
            namespace[name] = _through(chain)
        call = stmt.value
        kwargs = ast.Dict([ast.Constant(k.arg) for k in call.keywords], [k.value for k in call.keywords])
        stmt.value = ast.Call(ast.Name(name, ast.Load()), [call.func, ast.Tuple(call.args, ast.Load()), kwargs], [])
    ast.fix_missing_locations(tree)
    exec(compile(tree, gm.forward.__code__.co_filename, "exec"), namespace)
    return types.MethodType(namespace["forward"], gm)
