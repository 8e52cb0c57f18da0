"""Real in-process IPython shells with the extension loaded, the way the tests drive a notebook.

A shell has history off (SQLite history gives "too many open files" in a large suite). The shell
outlives its test (IPython's ``atexit`` keeps it), so ``loaded_shell`` empties it on the way out: its
namespace, ``Out``, ``_``, the exceptions and last tracebacks IPython and ``sys`` keep (their frames
hold the cell's locals), then collects the cycles the test left: the next test starts with no device
memory in use and the default device restored.

``instance=True`` makes it IPython's singleton, so ``display()`` goes through its display publisher
(what ``capture_output`` captures) as in a real frontend.

``in_child_shell`` is the same for a test that needs a fresh interpreter (``run_python``): a setting read once
per process, or which modules a step imports.
"""

from __future__ import annotations

import gc
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

from neuron_lab.session.devices import default_device

# The shell a child interpreter's code starts with: a frontend's singleton, history off, the extension not loaded.
_CHILD_SHELL = """\
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

c = Config()
c.HistoryAccessor.enabled = False
sh = InteractiveShell.instance(config=c)
"""


@contextmanager
def loaded_shell(*, instance: bool = False) -> Iterator[InteractiveShell]:
    c = Config()
    c.HistoryAccessor.enabled = False
    # A long compile's progress lines would land in the output of whichever test's compile happens to be slow on
    # the machine (test_waits and the kernel tests check them, with their own setting): none here.
    c.NeuronLab.compile_progress_s = 1e9
    sh = InteractiveShell.instance(config=c) if instance else InteractiveShell(config=c)
    default_before = default_device()
    with capture_output():
        sh.run_line_magic("load_ext", "neuron_lab")
    try:
        yield sh
    finally:
        with capture_output():
            sh.run_line_magic("unload_ext", "neuron_lab")
        release(sh)
        gc.collect()
        torch.set_default_device(default_before)  # None when none was set: no device mode left behind
        InteractiveShell.clear_instance()


def release(sh: InteractiveShell) -> None:
    """Drop every reference the shell keeps to what its cells made, without ``reset()``'s own ``gc.collect()``
    (its display hook's flush collects before the namespace is even cleared: one full collection thrown away).

    Dynamo deletes the globals a compiled frame installed in the namespace (``__compiled_fn_*``,
    ``__builtins_dict___N``) when the frame's compiled code dies, which is after ``reset()`` has removed them (the code
    lives on in the cells' code objects and their reports, often until exit): each deletion would then fail with
    "Exception ignored ... KeyError: '__builtins_dict___0'". Its hooks for this namespace get a dict of their own."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None:
        for hooks in dynamo.CleanupManager.instance.values.values():
            for cleanup in hooks:
                if cleanup.scope is sh.user_ns:
                    cleanup.scope = {cleanup.name: None}
    hook = sh.displayhook
    full, hook.do_full_cache = hook.do_full_cache, False
    sh.reset()  # namespace, Out, the exceptions history keeps
    hook.do_full_cache = full
    hook._ = hook.__ = hook.___ = ""
    sh.InteractiveTB.tb = None
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        sys.__dict__.pop(name, None)


def in_child_shell(code: str) -> str:
    """``code`` (indented as in the test) after the lines that make a child's shell ``sh``, with ``capture_output``
    imported: the text for ``run_python``."""
    return _CHILD_SHELL + textwrap.dedent(code)


def run(sh: InteractiveShell, code: str, *, ok: bool = True):
    """Run a cell as a frontend would (stored in history); returns (result, captured output)."""
    with capture_output() as cap:
        res = sh.run_cell(code, store_history=True)
    if ok:
        assert res.success, f"cell failed: {res.error_in_exec or res.error_before_exec}\n{cap.stdout}"
    return res, cap
