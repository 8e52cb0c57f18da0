"""Notebook cells as code: which frames are cells, and running a cell magic's body like a cell.

IPython names each cell's code through ``shell.compile`` (``<ipython-input-N-…>`` in a terminal,
``/tmp/ipykernel_…/….py`` in a kernel), maps each name to its execution count
(:func:`neuron_lab.compat.ipython.cell_numbers`) and keeps its source in ``linecache``; all are used here.
"""

from __future__ import annotations

import ast
import linecache
import sys
from types import CodeType
from typing import Any

from neuron_lab.compat import ipython
from neuron_lab.report.model import Site
from neuron_lab.trace.sites import Locator


class CellLocator(Locator):
    """User code is code compiled from a notebook cell."""

    def __init__(self, shell: Any) -> None:
        super().__init__()
        self._map = ipython.cell_numbers(shell.compile)
        self._compiler = shell.compile

    def _cell_of(self, filename: str) -> int | None:
        n = self._map.get(filename)
        if n is None and hasattr(self._compiler, "format_code_name"):
            label = self._compiler.format_code_name(filename)  # ("Cell", "In[3]") when it is a cell
            if label and label[1].startswith("In["):
                n = int(label[1][3:-1])
        return n

    def current_cell(self) -> int | None:
        """The execution count of the cell whose code is running on this thread's stack."""
        f = self.user_frame(sys._getframe(1))
        return None if f is None else self._cell_of(f.f_code.co_filename)

    def newest_cell(self) -> int | None:
        """The highest execution count compiled so far: the running cell, once its code is compiled.

        Safe from another thread (a concurrent insert makes it answer None for that call).
        """
        try:
            return max(self._map.values(), default=None)
        except RuntimeError:  # the dict grew during the scan
            return None

    def cell_label(self, filename: str) -> str | None:
        """A cell's file as IPython's tracebacks name it (``Cell In[5]``); None for any other file."""
        n = self._cell_of(filename)
        return None if n is None else f"Cell In[{n}]"

    def is_user_file(self, filename: str) -> bool:
        return self._cell_of(filename) is not None

    def _new_site(self, filename: str, line: int) -> Site:
        return Site(filename, line, linecache.getline(filename, line).strip(), self._cell_of(filename))


def run_body(shell: Any, body: str, raw_cell: str, number: int) -> Any:
    """Run a cell magic's body the way IPython runs a cell; returns the last expression's value.

    Line numbers and the source shown in tracebacks are those of ``raw_cell`` (the magic line
    included); assignments land in the user namespace; IPython's input and AST transformers apply.
    """
    __tracebackhide__ = True  # noqa: F841  (IPython hides this frame from tracebacks)
    return run_compiled(shell, compile_body(shell, body, raw_cell, number))


Compiled = tuple[CodeType, CodeType | None]  # a body's statements, and its last expression's (None: it has none)


def compile_body(shell: Any, body: str, raw_cell: str, number: int) -> Compiled:
    """A cell magic's body compiled as IPython compiles a cell (:func:`run_body`), to run once or several times (a
    check's timed runs time the body, not its parsing)."""
    name = shell.compile.cache(raw_cell, number, raw_code=raw_cell)
    code = shell.transform_cell(body)
    tree = shell.compile.ast_parse(code, filename=name)
    ast.increment_lineno(tree, max(len(raw_cell.splitlines()) - len(body.splitlines()), 0))
    tree = shell.transform_ast(tree)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    return shell.compile(tree, name, "exec"), None if last is None else shell.compile(last, name, "eval")


def run_compiled(shell: Any, compiled: Compiled) -> Any:
    """Run a body :func:`compile_body` made, in the user namespace; the last expression's value."""
    __tracebackhide__ = True  # noqa: F841
    statements, last = compiled
    exec(statements, shell.user_global_ns, shell.user_ns)
    return None if last is None else eval(last, shell.user_global_ns, shell.user_ns)
