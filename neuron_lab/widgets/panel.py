"""The live view: one anywidget that shows any of the views, as tabs when there are several.

The kernel sends data (``data``, rebuilt after each cell; a snapshot's only until its own cell ends) and
counters (``live``, a few times a second while a cell runs); ``panel.js`` draws them and keeps the UI state
(tab, sort, filter, expanded rows, the chart's zoom) in the browser, because browser-to-kernel messages wait
while a cell is busy. The one kernel action, "free", therefore runs between cells, and the button says so.

Next to the widget, its display carries a static snapshot (text and HTML) for whatever cannot run the widget: an
nbconvert export, an untrusted notebook. A view that follows the session is displayed with a display id, and the
end of each cell updates that display, so the snapshot (and the saved notebook) is its last state.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from neuron_lab.widgets import snapshot, static

_HERE = Path(__file__).parent
_VENDOR = _HERE / "vendor"  # uPlot (MIT, its LICENSE beside it), bundled: the notebook may have no network


class Panel(anywidget.AnyWidget):
    _esm = (_VENDOR / "uPlot.iife.min.js").read_text() + "\n" + (_HERE / "panel.js").read_text()
    _css = (_VENDOR / "uPlot.min.css").read_text() + "\n" + (_HERE / "panel.css").read_text()

    views = traitlets.List(traitlets.Unicode()).tag(sync=True)
    data = traitlets.Dict().tag(sync=True)
    live = traitlets.Dict().tag(sync=True)
    uid = traitlets.Unicode().tag(sync=True)  # keys the browser-side UI state across re-renders
    follow = traitlets.Bool(True).tag(sync=True)  # False: a snapshot of the cell that opened it

    def __init__(self, hub: Any, views: list[str], *, follow: bool = True, **kwargs: Any) -> None:
        super().__init__(views=list(views), uid=uuid.uuid4().hex, follow=follow, **kwargs)
        self.hub = hub
        self.sync_lock = threading.Lock()  # the refresh thread and the main thread both send
        self.freed: str | None = None
        self.handles: list[Any] = []  # the DisplayHandles of its displays, updated by ``update_displays``
        self.on_msg(self._on_frontend_msg)

    # -- kernel -> browser --------------------------------------------------------------------
    def refresh(self) -> None:
        """Rebuild the data of every view (main thread: after a cell, on display, after free)."""
        data = snapshot.build(self.hub.session, self.views)
        if self.freed and "memory" in data:
            data["memory"]["freed"] = self.freed
        live = self.hub.live(settle=True)
        with self.sync_lock, self.hold_sync():
            self.data = data
            self.live = live

    def set_live(self, live: dict[str, Any]) -> None:
        with self.sync_lock:
            self.live = live  # an equal dict sends nothing

    # -- browser -> kernel (between cells) ----------------------------------------------------
    def _on_frontend_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("action") == "free":
            self.hub.free(self)

    # -- display ------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any):
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if data is not None:  # a frontend without widgets shows these instead, stamped as a snapshot
            data["text/plain"] = static.render_text(self.data, self.live, self.views, stamped=True)
            data["text/html"] = static.render_html(self.data, self.live, self.views, stamped=True)
        return bundle

    def _ipython_display_(self) -> None:
        if not self.follow:  # a snapshot is a plain value (its Out[N]), its text the state of the cell it is made in
            raise NotImplementedError  # IPython's cue to format it the usual way (_repr_mimebundle_)
        self.display()

    def display(self) -> Any:
        """Display the view with a display id (also what showing a following view as a cell's value does); the
        handle it returns is kept, so :meth:`update_displays` can bring the snapshot beside the widget up to date."""
        from IPython.display import display

        handle = display(self._bundle(), raw=True, display_id=True)
        if handle is not None:  # None outside an IPython shell, where display prints
            self.handles.append(handle)
        return handle

    def update_displays(self) -> None:
        """Put the current state into every display of the view (``update_display_data``)."""
        if self.handles:
            bundle = self._bundle()
            for handle in self.handles:
                handle.update(bundle, raw=True)

    def _bundle(self) -> dict[str, Any]:
        """The display data alone (``_repr_mimebundle_`` may pair it with metadata)."""
        bundle = self._repr_mimebundle_()
        return bundle[0] if isinstance(bundle, tuple) else bundle

    def close(self) -> None:
        """Stop updating this view and drop its model."""
        hub, self.hub = getattr(self, "hub", None), None
        if hub is not None:
            hub.remove(self)
        super().close()
