"""Real in-process IPython shells with the extension loaded, the way the tests drive a notebook.

A shell has history off (SQLite history gives "too many open files" in a large suite). The shell
outlives its test (IPython keeps references to it), so ``loaded_shell`` resets its namespace on the
way out: the next test starts with no device memory in use and the default device restored.

``instance=True`` makes it IPython's singleton, so ``display()`` goes through its display publisher
(what ``capture_output`` captures) as in a real frontend.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

from neuron_lab.session.devices import default_device


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
            sh.reset()
        gc.collect()
        torch.set_default_device(default_before)  # None when none was set: no device mode left behind
        InteractiveShell.clear_instance()


def run(sh: InteractiveShell, code: str, *, ok: bool = True):
    """Run a cell as a frontend would (stored in history); returns (result, captured output)."""
    with capture_output() as cap:
        res = sh.run_cell(code, store_history=True)
    if ok:
        assert res.success, f"cell failed: {res.error_in_exec or res.error_before_exec}\n{cap.stdout}"
    return res, cap
