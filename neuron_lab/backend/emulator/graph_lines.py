"""An aten graph whose ops run at the user's lines: its code recompiled with each statement at the line its
FX node came from (``node.meta["stack_trace"]``, which aot_autograd keeps on forward and backward nodes).

Run op by op, a compiled graph's ops would otherwise sit in generated code (``<eval_with_key>``), and
whoever walks the stack for the line behind an op (neuron_lab's call sites, a traceback) would find only
the line that called the compiled function. With this they find the model's own line, as in eager mode.
"""

from __future__ import annotations

import ast
import os
import re
import types
from collections.abc import Callable
from typing import Any

import torch

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_NOT_USER = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.__file__) + os.sep,
             os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep)


def _user_line(stack_trace: str | None) -> tuple[str, int] | None:
    """The innermost frame of a node's stack trace outside torch, the standard library and neuron_lab."""
    for m in reversed(list(_FRAME.finditer(stack_trace or ""))):
        f = m["file"]
        if f.startswith((*_NOT_USER, "<eval_with_key", "<frozen")) or f"{os.sep}site-packages{os.sep}" in f:
            continue
        return f, int(m["line"])
    return None


def located_forward(gm: torch.fx.GraphModule) -> Callable[..., Any] | None:
    """``gm.forward`` compiled under the user's file name, each statement at its node's user line; None when
    no node has a user line, or the lines are in several files (one code object has one file name): the
    line that called the compiled function is then the best there is."""
    where = {n.name: _user_line(n.meta.get("stack_trace")) for n in gm.graph.nodes if n.op == "call_function"}
    files = {w[0] for w in where.values() if w is not None}
    if len(files) != 1:
        return None
    (filename,) = files
    lines = [w[1] for w in where.values() if w is not None]
    tree = ast.parse(gm.code)
    fn = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "forward")
    line = min(lines)
    _place(fn, line, body=False)
    for stmt in fn.body:
        targets = [t.id for t in ast.walk(stmt) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)]
        loc = next((where[t] for t in targets if where.get(t) is not None), None)
        if loc is not None:
            line = loc[1]
        _place(stmt, line)  # plumbing without a line of its own sits with the statement before it
    namespace = dict(gm.forward.__func__.__globals__)
    exec(compile(tree, filename, "exec"), namespace)
    return types.MethodType(namespace["forward"], gm)


def _place(node: ast.AST, line: int, body: bool = True) -> None:
    for n in ast.walk(node) if body else (node, node.args, *ast.walk(node.args)):
        if hasattr(n, "lineno"):
            n.lineno = n.end_lineno = line
            if getattr(n, "end_col_offset", None) is not None and n.end_col_offset < n.col_offset:
                n.end_col_offset = n.col_offset
