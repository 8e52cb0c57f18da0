"""Whose code a source file holds, for the call sites every report shows.

PyTorch's, the standard library's (and its backports': ``typing_extensions``, whose ``@deprecated`` wraps
``torch.distributed`` calls) and neuron_lab's own files, and code Python generated (``<frozen ...>``,
FX's ``<eval_with_key>``), are internal: no user asked to see them in a call site. Any other file that is not
the user's is a library's (``transformers/models/t5/modeling_t5.py``): a call site names its innermost line as
well as the user's line that led to it. IPython's own frames bound the user's call chain from above. The
trace's call sites and the emulator's compiled graphs both ask here.
"""

from __future__ import annotations

import importlib.util
import os

_SITE_PACKAGES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None else None
    return os.path.dirname(origin) + os.sep if origin else os.sep + name + os.sep


_OWN_DIRS = (_package_dir("torch"), os.path.dirname(os.path.abspath(__file__)) + os.sep)  # torch's, neuron_lab's
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_BACKPORT_FILES = frozenset(spec.origin for spec in map(importlib.util.find_spec, ("typing_extensions",))
                            if spec is not None and spec.origin)
_SHELL_DIRS = tuple(_package_dir(name) for name in ("IPython", "ipykernel"))
_NOTEBOOK_CELL = "<ipython-input-"  # a terminal IPython's cells: the user's code, though Python did not read a file


def is_internal(filename: str) -> bool:
    """PyTorch, the standard library, neuron_lab, or generated code: never shown as a call site."""
    if filename.startswith("<"):
        return not filename.startswith(_NOTEBOOK_CELL)
    if filename.startswith(_OWN_DIRS) or filename in _BACKPORT_FILES:
        return True
    return filename.startswith(_STDLIB_DIR) and not is_installed(filename)  # site-packages may sit in the stdlib


def is_shell(filename: str) -> bool:
    """IPython's or ipykernel's: the shell that runs cells (and cell magics' bodies), above any user's call chain."""
    return filename.startswith(_SHELL_DIRS)


def is_installed(filename: str) -> bool:
    """A file of an installed package (under site-packages)."""
    return any(sp in filename for sp in _SITE_PACKAGES)


def shown_path(filename: str) -> str:
    """A file as a call site names it: an installed package's from its package (``transformers/models/t5/…``)."""
    for sp in _SITE_PACKAGES:
        if sp in filename:
            return filename.rpartition(sp)[2]
    return filename
