"""In the kernel of a script's run: IPython compiles each chunk at its own lines in the script, named after the script.

Chunk N runs as cell In[N] (:class:`neuron_lab.agent.Script`). Left alone, IPython numbers a cell's lines from 1
and names its code ``Cell In[N]``, so a traceback said ``Cell In[2], line 4`` for the script's line 8. Here IPython's
compiler parses chunk N as many lines down as it starts in the script (``ast_parse``: a SyntaxError's line too),
caches its text at the same lines, below the script's lines above it (``linecache``: what tracebacks and reports
quote), and names it ``File train.py`` (``format_code_name``: how IPython's tracebacks label a code name). Every
frame then carries the script's line, as ``python train.py``'s would; the cell keeps its number in IPython's map, so
the reports still find their cell (``session.cells.CellLocator``) and only rename it (``Script.as_script_lines``).
"""

from __future__ import annotations

import linecache
from typing import Any

from neuron_lab.agent import Script


def compile_as_script(compiler: Any, script: Script) -> None:
    """Make ``compiler`` (``shell.compile``) compile and name the script's chunks at the script's lines."""
    offsets: dict[str, int] = {}  # a chunk's code name: how many lines into the script it starts
    cache, ast_parse, format_code_name = compiler.cache, compiler.ast_parse, compiler.format_code_name

    def cache_at_script_lines(transformed_code: str, number: int = 0, raw_code: str | None = None) -> str:
        name = cache(transformed_code, number, raw_code)
        offset = script.offset(number)
        if offset is not None:
            offsets[name] = offset
            above = (linecache.getlines(script.file) + ["\n"] * offset)[:offset]  # a traceback's context above it
            size, mtime, lines, fullname = linecache.cache[name]
            linecache.cache[name] = (size, mtime, above + lines, fullname)
        return name

    def parse_at_script_lines(source: str, filename: str = "<unknown>", symbol: str = "exec") -> Any:
        return ast_parse("\n" * offsets.get(filename, 0) + source, filename, symbol)

    def named_as_script(name: str) -> tuple[str, str] | None:
        return ("File", script.path) if name in offsets else format_code_name(name)

    compiler.cache, compiler.ast_parse, compiler.format_code_name = (
        cache_at_script_lines, parse_at_script_lines, named_as_script)
