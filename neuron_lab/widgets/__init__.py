"""Live views over a session: memory, device tensors, the CPU-fallback inspector, compiles.

They read the session's data (``snapshot``) and never ask which backend runs. Under a kernel
they are anywidgets updated while cells run; elsewhere they degrade to text and HTML.
"""

from __future__ import annotations

from typing import Any

from neuron_lab.widgets.snapshot import STRIP, VIEWS


def hub_of(session: Any) -> Any:
    """The session's hub of views (made on first use; it is ``session.views`` and closes with the session)."""
    if session.views is None:
        from neuron_lab.widgets.hub import Hub

        session.views = Hub(session)
    return session.views


def show(session: Any, views: list[str] | tuple[str, ...] = VIEWS, *, live: bool = True) -> Any:
    """The view object for ``views``; display it (or make it a cell's value) to see it.

    ``live``: it follows the session; otherwise it shows the state at the end of the running cell and stays so.
    """
    unknown = [v for v in views if v not in (*VIEWS, STRIP)]
    if unknown:
        raise ValueError(f"unknown view {', '.join(map(repr, unknown))}; views: {', '.join(VIEWS)}")
    return hub_of(session).show(list(views), follow=live)


__all__ = ["VIEWS", "hub_of", "show"]
