"""The window's resident-memory read (trace/rss.py) agrees with psutil, in this process and in a forked child."""

from __future__ import annotations

import multiprocessing
import os

import psutil
import pytest

from neuron_lab.trace.rss import rss

MiB = 1 << 20


def test_rss_is_psutils_reading() -> None:
    assert abs(rss() - psutil.Process().memory_info().rss) < 4 * MiB


def _child(out) -> None:
    from neuron_lab.trace import rss as module

    out.send((rss(), psutil.Process().memory_info().rss, module._statm[0] == os.getpid()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_reads_its_own_memory() -> None:
    rss()  # the descriptor is open in the parent before the fork
    parent_end, child_end = multiprocessing.get_context("fork").Pipe()
    p = multiprocessing.get_context("fork").Process(target=_child, args=(child_end,))
    p.start()
    assert parent_end.poll(60), "the child sent nothing in 60 s"
    ours, theirs, own = parent_end.recv()
    p.join(60)
    # the child reads through a descriptor of its own, not the parent's (opened on the parent's /proc entry)
    assert own and abs(ours - theirs) < 4 * MiB, (ours, theirs, own)
