"""torch's private names: how a dispatch mode keeps dynamo out of its ``__torch_dispatch__`` without loading dynamo.

neuron_lab supports the torch minor its compiled core was built against (``setup.py`` pins it).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

DYNAMO = "torch._dynamo"


class DispatchMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` whose ``__torch_dispatch__`` runs outside dynamo only once dynamo is loaded.

    torch (2.13) wraps each subclass's ``__torch_dispatch__`` in the private ``torch._disable_dynamo`` when the private
    classmethod ``_should_skip_dynamo()`` answers True (its default), so that a compiled frame never traces into a
    mode; that wrapper imports ``torch._dynamo`` at the mode's first op: seconds and 70 MiB, paid by an eager cell
    that compiles nothing. Before dynamo is loaded nothing can be compiled or traced, so a subclass of this class
    answers False and gets dynamo's public ``disable`` from the first op after dynamo loaded. A torch without the
    hook wraps as it always did: dynamo loads at the first op, as before.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dispatch = cls.__dict__.get("__torch_dispatch__")
        if callable(dispatch):
            cls.__torch_dispatch__ = _outside_dynamo_once_loaded(dispatch)


def _outside_dynamo_once_loaded(fn: Callable[..., Any]) -> Callable[..., Any]:
    disabled: list[Callable[..., Any]] = []  # dynamo's disable of ``fn``, made at the first call after it loaded

    @functools.wraps(fn)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if disabled:
            return disabled[0](*args, **kwargs)
        disable = getattr(sys.modules.get(DYNAMO), "disable", None)  # None: not loaded, or still loading
        if disable is None:
            return fn(*args, **kwargs)
        disabled.append(disable(fn, recursive=True))
        return disabled[0](*args, **kwargs)

    return dispatch
