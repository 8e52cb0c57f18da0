"""``neuron-lab run --trace DIR``: the folder, each cell's file name, the ranks' traces of a cell merged into one,
and the lines that say where the traces are.

Cell k of n (the ``[k/n]`` of the progress lines) writes ``cell-00k.json``: the names sort in the input's order,
a script's ``# %%`` chunks and a notebook's code cells alike. With ``--nproc`` rank R writes
``cell-00k.rankR.json`` and the runner merges the ranks' into ``cell-00k.json`` (``trace.merge``). The folder
holds only this run's: an earlier run's ``cell-*.json`` are removed before the first cell runs.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from neuron_lab.runner.inputs import InputError
from neuron_lab.runner.records import CellRecord
from neuron_lab.trace import merge
from neuron_lab.units import count

VIEWER = "https://ui.perfetto.dev"
_OURS = re.compile(r"cell-\d{3,}(\.rank\d+)?\.json")  # the names cell_file gives, and no other file


def prepare(folder: str) -> Path:
    """The folder, created if missing and emptied of an earlier run's traces; :class:`InputError` (exit 2, before
    any cell runs) when it cannot be used. Writability is tried with a file, not ``os.access`` (root passes that
    on a read-only mount)."""
    path = Path(folder).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--trace {folder}: cannot create the folder: {e.strerror or e}") from None
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".neuron-lab-probe-"):
            pass
        for old in path.iterdir():
            if _OURS.fullmatch(old.name) and old.is_file():
                old.unlink()
    except OSError as e:
        raise InputError(f"--trace {folder}: cannot write into {path.resolve()}: {e.strerror or e}") from None
    return path.resolve()


def cell_file(folder: Path, number: int, cells: int, rank: int | None = None) -> Path:
    """Cell ``number``'s trace (one rank's, with ``rank``); zero-padded so that the names sort."""
    width = max(3, len(str(cells)))
    return folder / f"cell-{number:0{width}d}{'' if rank is None else f'.rank{rank}'}.json"


def fresh(folder: Path, number: int, cells: int, rank: int | None = None) -> str:
    """Cell ``number``'s trace file (rank ``rank``'s), with an older run's there (and the merged one) removed, so
    that a file there afterwards is this run's."""
    for path in (cell_file(folder, number, cells), cell_file(folder, number, cells, rank)):
        path.unlink(missing_ok=True)
    return str(cell_file(folder, number, cells, rank))


def merge_cell(folder: Path, number: int, cells: int, ranks: int) -> tuple[Path | None, str | None]:
    """The ranks' traces of cell ``number`` merged into one file: (its path, why not) (a rank that was
    stopped before the cell ended wrote none: the others are merged)."""
    traces = {}
    for rank in range(ranks):
        path = cell_file(folder, number, cells, rank)
        if path.is_file():
            try:
                traces[rank] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                return None, f"cannot read {path}: {e}"
    if not traces:
        return None, None
    out = cell_file(folder, number, cells)
    try:
        out.write_text(json.dumps(merge.merge(traces)))
    except OSError as e:
        return None, f"cannot write {out}: {e.strerror or e}"
    return out, None


def missing(rec: CellRecord, rank: int | None = None) -> list[str]:
    """The line after a cell's progress line when it (rank ``rank``'s) wrote no trace, and why
    (``cell 3: no trace (the cell ran its own profiler)``)."""
    on = "" if rank is None else f" on rank {rank}"
    return [] if rec.no_trace is None else [f"cell {rec.number}: no trace{on} ({rec.no_trace})"]


def said(folder: Path, files: list[Path], without: int = 0, ranks: bool = False) -> list[str]:
    """Where the traces are, and how many cells that ran wrote none (on some rank, with ``ranks``): one line for
    the run's summary."""
    none = f"; {count(without, 'cell')} without one{' on a rank' if ranks else ''} (said above)" if without else ""
    if not files:
        return [f"traces: none written to {folder} (no cell ran under the profiler){none}"]
    names = files[0].name if len(files) == 1 else f"{files[0].name} … {files[-1].name}"
    return [f"traces: {count(len(files), 'Chrome trace')} in {folder}{os.sep} ({names}){none}; open one in {VIEWER}"]
