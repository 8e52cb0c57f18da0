"""What ``neuron-lab run PATH`` runs: a notebook as it is, or a script cut into cells at ``# %%`` markers.

A script runs in the same kind of kernel as a notebook, one cell per ``# %%`` chunk (the percent
format of Jupytext, VS Code and Spyder; a script without markers is one cell), so it gets the same
per-cell reports; the kernel side reports its lines as ``path:line`` of the script.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

_MARKER = re.compile(r"^# ?%%")


class InputError(ValueError):
    """PATH cannot be run: the message is the whole story (no traceback)."""


@dataclass
class Program:
    path: Path
    kind: str  # "notebook" | "script"
    nb: Any  # the nbformat v4 notebook that runs (a script's chunks as code cells)
    first_lines: list[int] = field(default_factory=list)  # a script's: the line each code cell starts on

    @property
    def code_cells(self) -> list[int]:
        """Indexes of the cells that execute (nbclient skips markdown and blank cells)."""
        return [i for i, c in enumerate(self.nb.cells) if c.cell_type == "code" and c.source.strip()]


def load(path: Path) -> Program:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if not path.is_file():
        raise InputError(f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix == ".ipynb":
        return Program(path, "notebook", _notebook(path))
    if suffix == ".py":
        return _script(path)
    raise InputError(f"{path}: not a notebook (.ipynb) or a Python script (.py)")


def _notebook(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a notebook: the file is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not a notebook: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") \
            from None
    if not isinstance(data, dict) or "cells" not in data:
        raise InputError(f"{path}: not a notebook: the JSON has no 'cells'")
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception as e:  # nbformat raises ValidationError, NBFormatError, KeyError, ... for bad documents
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{path}: invalid notebook: {first}") from None
    return nb


def _script(path: Path) -> Program:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a Python script: the file is not UTF-8 text") from None
    lines = text.splitlines(keepends=True)
    starts = [0] + [i for i, line in enumerate(lines) if _MARKER.match(line) and i > 0]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    first_lines = []
    for start, end in zip(starts, starts[1:] + [len(lines)]):
        source = "".join(lines[start:end]).rstrip("\n")
        if source.strip():
            nb.cells.append(nbformat.v4.new_code_cell(source))
            first_lines.append(start + 1)
    return Program(path, "script", nb, first_lines)
