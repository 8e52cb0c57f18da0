"""The files ``neuron-lab run`` writes: the executed notebook (.ipynb), its HTML, and the run as JSON.

The executed notebook already holds each cell's report inline: the extension displays it under the
cell (text/plain and text/html), and nbclient keeps that output like any other, so the HTML export
shows the reports where Jupyter shows them. Above the first cell the HTML has the run's summary block and
gate verdicts (``page.head``); the executed notebook stays as the kernel left it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import nbformat

SCHEMA = "neuron_lab.run/1"


def _target(path: str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def write_notebook(nb: Any, path: str) -> None:
    nbformat.write(nb, _target(path))


def write_html(nb: Any, path: str, head: str = "") -> None:
    """The notebook as nbconvert's HTML, with ``head`` first in the page's body (inside ``<main>``, where the
    cells are, so it takes their width). Without the widgets' saved state, so each widget shows its static
    snapshot (the views' last state) and the page needs no widget library from the web."""
    from nbconvert import HTMLExporter  # imports jinja2 and the templates: only when asked for

    static = nbformat.from_dict({**nb, "metadata": {k: v for k, v in nb.metadata.items() if k != "widgets"}})
    body, _ = HTMLExporter().from_notebook_node(static)
    if head:
        at = re.search(r"<main[^>]*>|<body[^>]*>", body)
        end = at.end() if at else 0
        body = f"{body[:end]}\n{head}\n{body[end:]}"
    _target(path).write_text(body, encoding="utf-8")


def write_json(doc: dict[str, Any], path: str) -> None:
    _target(path).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
