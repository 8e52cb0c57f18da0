"""Dynamo's error for a graph break that ``fullgraph=True`` forbids, told in the user's frames.

Dynamo raises ``Unsupported`` from torch.compile's wrapper, and its message ends with the frames it was tracing
("from user code:"): under ``%%neuron compile`` the first are the compile mode's module call and torch.nn's call
plumbing, three frames of 12 lines before the user's ``forward``. The cell's report already names the breaking
line with why and how to avoid it; the message keeps dynamo's explanation and only the user's frames, and a
``%%neuron`` cell's traceback ends at the user's line, not in torch.compile's wrapper.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from neuron_lab import frames

_FROM_USER_CODE = "\nfrom user code:\n"
_FRAME = re.compile(r'^ {2,3}File "(?P<file>[^"]+)", line \d+, in ', re.M)


def is_graph_break_error(error: BaseException) -> bool:
    """Whether ``error`` is dynamo's ``Unsupported``: a graph break where the compile allows none (looked up, not
    imported: without dynamo loaded nothing raised it)."""
    exc = sys.modules.get("torch._dynamo.exc")
    return exc is not None and isinstance(error, exc.Unsupported)


def user_frames_only(message: str) -> str:
    """``message`` with the "from user code:" frames that are torch's or neuron_lab's left out."""
    head, sep, rest = message.partition(_FROM_USER_CODE)
    if not sep:
        return message
    listing, blank, tail = rest.partition("\n\n")
    starts = [m.start() for m in _FRAME.finditer(listing)]
    if not starts:
        return message
    entries = [listing[a:b] for a, b in zip(starts, [*starts[1:], len(listing)])]
    kept = [e for e in entries if not frames.is_internal(_FRAME.match(e)["file"])] or entries[-1:]
    return head + sep + "".join(kept).rstrip("\n") + blank + tail


def keep_user_frames(error: BaseException) -> None:
    """Leave torch's and neuron_lab's frames out of ``error``'s "from user code:" list, in place."""
    if error.args and isinstance(error.args[0], str):
        error.args = (user_frames_only(error.args[0]), *error.args[1:])


def name_cells(error: BaseException, cell_label: Callable[[str], str | None]) -> None:
    """Name a notebook cell's frames in ``error``'s "from user code:" list as IPython's traceback names them
    (``Cell In[5], line 8``, not Jupyter's ``File "/tmp/ipykernel_…/….py", line 8``), in place; ``cell_label``
    gives a file's name (None: not a cell's)."""
    if not (error.args and isinstance(error.args[0], str)) or _FROM_USER_CODE not in error.args[0]:
        return
    head, sep, rest = error.args[0].partition(_FROM_USER_CODE)

    def named(m: re.Match) -> str:
        label = cell_label(m["file"])
        return m[0] if label is None else m[0].replace(f'File "{m["file"]}"', label, 1)

    error.args = (head + sep + _FRAME.sub(named, rest), *error.args[1:])
