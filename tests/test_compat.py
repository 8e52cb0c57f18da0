"""Each private name neuron_lab.compat reads works against the installed IPython, nbclient and argparse.

A release that renames one fails here, by name, before a user's cell or run meets it; each function's
fallback (what it answers when the name is missing) is checked too.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import inspect
import types

import IPython
import nbclient
import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from neuron_lab.compat import argparse as argparse_compat
from neuron_lab.compat import ipython
from neuron_lab.compat import nbclient as nbclient_compat
from neuron_lab.compat import torch as torch_compat


@pytest.fixture
def shell():
    c = Config()
    c.HistoryAccessor.enabled = False
    return InteractiveShell(config=c)


def test_traceback_storage_is_the_shells_own_formatter_from_ipython_9(shell):
    pairs = ipython.traceback_storage(shell)
    if IPython.version_info < (9,):
        assert pairs == []
        return
    ((obj, name),) = pairs
    assert obj is shell and name == "_format_exception_for_storage"
    try:
        raise ValueError("boom")
    except ValueError as e:
        stored = getattr(obj, name)(e)
    assert "ValueError" in str(stored) and "boom" in str(stored)


def test_traceback_storage_without_the_method_is_nothing_to_wrap():
    assert ipython.traceback_storage(types.SimpleNamespace()) == []


def test_cell_numbers_is_ipythons_live_map_of_cell_names(shell):
    numbers = ipython.cell_numbers(shell.compile)
    shell.run_cell("a = 1", store_history=True)
    shell.run_cell("b = 2", store_history=True)
    assert sorted(numbers.values())[-2:] == [1, 2]  # the same dict, grown by the cells that ran since
    name = next(n for n, k in numbers.items() if k == 2)
    assert shell.compile.format_code_name(name) == ("Cell", "In[2]")
    assert ipython.cell_numbers(shell.compile) is numbers


def test_cell_numbers_without_the_map_is_empty():
    assert ipython.cell_numbers(types.SimpleNamespace()) == {}
    assert ipython.cell_numbers(types.SimpleNamespace(_filename_map=None)) == {}


def test_arguments_lists_every_argument_of_a_parser_in_order():
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--all", action="store_true")
    assert [a.dest for a in argparse_compat.arguments(p)] == ["path", "all"]  # not -h
    assert argparse_compat.arguments(types.SimpleNamespace()) == []


def _client() -> nbclient.NotebookClient:
    return nbclient.NotebookClient(nbformat.v4.new_notebook(), kernel_name="python3")


def test_forget_exit_hook_drops_the_hook_nbclient_registers(monkeypatch):
    assert "atexit.register(self._cleanup_kernel)" in inspect.getsource(nbclient.NotebookClient.async_setup_kernel)
    client = _client()
    dropped = []
    monkeypatch.setattr(atexit, "unregister", dropped.append)
    nbclient_compat.forget_exit_hook(client)
    assert dropped == [client._cleanup_kernel]
    nbclient_compat.forget_exit_hook(types.SimpleNamespace())  # no hook under that name: nothing to drop
    assert len(dropped) == 1


def _run(coro) -> None:
    """``asyncio.run`` on a thread of its own: an earlier test of the same worker may have left an event loop marked
    running on this one (asyncio.run then refuses)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result(timeout=60)


def test_shut_down_is_nbclients_own_cleanup_or_the_kernel_managers_shutdown():
    client = _client()
    assert inspect.iscoroutinefunction(client._async_cleanup_kernel)
    cleaned = []

    async def cleanup() -> None:
        cleaned.append(True)

    client._async_cleanup_kernel = cleanup
    _run(nbclient_compat.shut_down(client))
    assert cleaned == [True]

    class Manager:
        stopped = None

        def shutdown_kernel(self, now: bool = False) -> None:
            self.stopped = now

    km = Manager()
    _run(nbclient_compat.shut_down(types.SimpleNamespace(km=km)))  # an nbclient without the private cleanup
    assert km.stopped is True


def test_a_dispatch_mode_answers_torchs_hook_so_torch_leaves_its_dispatch_unwrapped():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    assert callable(getattr(TorchDispatchMode, "_should_skip_dynamo", None))  # the hook torch's __init_subclass__ reads
    calls = []

    class Seen(torch_compat.DispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return func(*args, **(kwargs or {}))

    assert not Seen._should_skip_dynamo() and Seen.__torch_dispatch__.__wrapped__ is not None
    with Seen():
        assert torch.equal(torch.ones(2) * 2, torch.full((2,), 2.0))
    assert torch.ops.aten.mul.Tensor in calls
