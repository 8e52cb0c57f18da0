"""Which session each shell has: the extension registers the one it loads, and anything below the magics finds it.

The in-kernel agent (``neuron_lab.agent``), the widgets and the public API look a shell's session up here, so none of
them reaches it through the ``%neuron`` magic's object (that would be the layers' order turned upside down at run
time). Keyed weakly: a shell that goes away takes its entry with it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_lab.session.session import Session

_SESSIONS: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()


def register(shell: Any, session: Session) -> None:
    """``session`` is ``shell``'s from now on (``%load_ext neuron_lab``)."""
    _SESSIONS[shell] = session


def forget(shell: Any) -> None:
    """``shell`` has no session any more (``%unload_ext neuron_lab``)."""
    _SESSIONS.pop(shell, None)


def session_of(shell: Any) -> Session | None:
    """The session the extension loaded into ``shell``, or None."""
    return _SESSIONS.get(shell) if shell is not None else None
