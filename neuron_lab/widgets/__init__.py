"""Live views over a session: memory, device tensors, the CPU-fallback inspector, compiles.

They read the session's data (``snapshot``) and never ask which backend runs. Under a kernel
they are anywidgets updated while cells run; elsewhere they degrade to text and HTML.
"""

from __future__ import annotations

from typing import Any

from neuron_lab.widgets.snapshot import VIEWS

_hubs: dict[int, Any] = {}  # id(session) -> Hub


def hub_of(session: Any) -> Any:
    from neuron_lab.widgets.hub import Hub

    hub = _hubs.get(id(session))
    if hub is None or hub.session is not session:
        hub = _hubs[id(session)] = Hub(session)
    return hub


def show(session: Any, views: list[str] | tuple[str, ...] = VIEWS) -> Any:
    """The view object for ``views``; display it (or make it a cell's value) to see it."""
    unknown = [v for v in views if v not in (*VIEWS, "strip")]
    if unknown:
        raise ValueError(f"unknown view {', '.join(map(repr, unknown))}; views: {', '.join(VIEWS)}")
    return hub_of(session).show(list(views))


def close(session: Any) -> None:
    """Stop every view of ``session`` (unload does this)."""
    hub = _hubs.pop(id(session), None)
    if hub is not None:
        hub.close()


__all__ = ["VIEWS", "close", "hub_of", "show"]
