"""IPython's private names: where it formats a failed cell's traceback for its history, and its cell-name map.

neuron_lab supports IPython 8.12 and later (``pyproject.toml``).
"""

from __future__ import annotations

from typing import Any

TRACEBACK_STORAGE = "_format_exception_for_storage"
CELL_NAMES = "_filename_map"


def traceback_storage(shell: Any) -> list[tuple[Any, str]]:
    """The ``(object, method name)`` pairs through which ``shell`` formats a failed cell's traceback for its history.

    IPython 9.0 and later keep a formatted copy of each failed cell's traceback in
    ``history_manager.exceptions``, made by the private ``InteractiveShell._format_exception_for_storage``
    besides the traceback it shows (formatting can format tensors: device work that is IPython's, not the
    cell's). IPython 8 has no such step, and an IPython without the method answers ``[]``: nothing to wrap.
    """
    return [(shell, TRACEBACK_STORAGE)] if callable(getattr(shell, TRACEBACK_STORAGE, None)) else []


def cell_numbers(compiler: Any) -> dict[str, int]:
    """IPython's own map from each cell's code name to its execution count: the live dict, which grows as cells compile.

    The private ``CachingCompiler._filename_map`` (``shell.compile``), filled by ``CachingCompiler.cache``
    in IPython 8.0 and later (ipython/ipython#13043, for the ``Cell In[N]`` tracebacks). Missing, or not a
    dict: a new empty dict, so a frame's cell is found through the public ``format_code_name`` alone and the
    newest compiled cell is unknown (``CellLocator.newest_cell`` answers None).
    """
    names = getattr(compiler, CELL_NAMES, None)
    return names if isinstance(names, dict) else {}
