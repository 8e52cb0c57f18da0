"""``%load_ext neuron_lab`` / ``%unload_ext neuron_lab``: wire a session, its magics and config into a shell.

Loading twice is harmless; unloading undoes everything loading did (the cell events, the session's
modes and default device, the out-of-memory hook, the wrappers that keep IPython's own formatting out
of reports, the compile lowering, live views and rank engines, the magics, their Tab completion and the
configurable), so loading again afterwards starts clean. Only ``KINETO_LOG_LEVEL``, set where it was unset, stays:
Kineto reads it once per process.
"""

from __future__ import annotations

from typing import Any

from neuron_lab.session import shells
from neuron_lab.session.session import banner
from neuron_lab.units import ShownAsText

MAGICS = "NeuronMagics"  # the name IPython's magics registry keeps the loaded extension's state under


def load(shell: Any) -> None:
    if _magics_of(shell) is not None:
        return
    from neuron_lab.magics import NeuronMagics
    from neuron_lab.session.config import settings_of
    from neuron_lab.session.session import Session
    from neuron_lab.trace.profile import quiet_kineto

    quiet_kineto()  # before any profiler session of the notebook's, the user's own torch.profiler included

    config, problems = settings_of(shell)
    shell.configurables.append(config)
    session = Session(shell, config)
    magics = NeuronMagics(shell, session, config)
    shell.register_magics(magics)
    shell.Completer.custom_matchers.append(magics.completer.matcher)
    shells.register(shell, session)  # where the agent, the widgets and the API find it

    def show(report: Any) -> None:
        if not (config.auto_report and report.touched_device):
            return
        _display(_unshown(report, shell), shell)
        for note in session.notes.say(report):  # shown as the report is, under it: not in the cell's own stdout
            _display(_Note(note), shell)

    session.listeners.append(show)
    session.start()
    if config.auto_dashboard:
        _attach_widgets(session)
    config.observe(lambda change: change["new"] and _attach_widgets(session), names="auto_dashboard")
    print(banner(session))
    for problem in problems:
        print(f"neuron_lab: {problem}")


def unload(shell: Any) -> None:
    magics = _magics_of(shell)
    if magics is None:
        return
    session, config = magics.session, magics.settings
    session.close()  # views close with it
    shells.forget(shell)
    for kind in ("line", "cell"):
        table = shell.magics_manager.magics[kind]
        if getattr(table.get("neuron"), "__self__", None) is magics:
            del table["neuron"]
    shell.magics_manager.registry.pop(MAGICS, None)
    shell.Completer.custom_matchers[:] = [m for m in shell.Completer.custom_matchers
                                          if getattr(m, "__self__", None) is not magics.completer]
    for obj in (config, magics):  # register_magics lists the Magics instance as a configurable too
        if obj in shell.configurables:
            shell.configurables.remove(obj)


class _Note(ShownAsText):
    """A sentence shown under a report, as text or HTML (its `code` as <code>)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        from neuron_lab.report.html import sentence

        return f"<div style='font-family:monospace;font-size:12px'>{sentence(self.text)}</div>"


def _display(obj: Any, shell: Any) -> None:
    """Show ``obj`` (a report, a note) under the cell as its text and, where the shell shows HTML (a kernel, not a
    terminal), its HTML: rendered once each and published through the shell, as ``display()`` would (which asks a
    dozen formatters per object, every cell)."""
    data = {"text/plain": str(obj)}
    if "text/html" in shell.display_formatter.active_types:
        data["text/html"] = obj._repr_html_()
    shell.display_pub.publish(data=data, metadata={})


def _unshown(report: Any, shell: Any) -> Any:
    """The report as shown under its cell: a check the cell's ``Out`` already showed in full (``%%neuron parity``
    returns its result) is left out, so it is said once; the kept report still has it."""
    out = shell.user_ns.get("Out", {}).get(report.cell) if report.cell is not None else None
    if not any(c is out for c in report.checks):
        return report
    from dataclasses import replace

    return replace(report, checks=[c for c in report.checks if c is not out])


def _attach_widgets(session: Any) -> None:
    from neuron_lab import widgets

    widgets.hub_of(session)


def _magics_of(shell: Any) -> Any:
    """The loaded extension's magics (they hold its session and config), as IPython's own extensions find theirs."""
    return shell.magics_manager.registry.get(MAGICS)


def session_of(shell: Any) -> Any:
    """The loaded session of ``shell`` (for widgets and tests), or None."""
    return shells.session_of(shell)
