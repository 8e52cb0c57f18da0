"""Where each rank is stuck, asked while it is: the collective it waits in and the notebook line it waits at.

A rank blocked in a collective runs no request (its kernel's main thread is in gloo), and a stuck rank that never
reached the collective is blocked elsewhere; neither answers ipyparallel. So each rank keeps one daemon thread with
its own client of the rendezvous store the notebook hosts (:class:`~neuron_lab.session.launch.AgentStore`), waiting
for a question there (its wait releases the GIL); asked, it reads the main thread's stack (``sys._current_frames``:
the cell's line) and the collective the backend says the main thread is in, and puts the answer in the store.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from neuron_lab.session.launch import store_client

ASK = "neuron_lab/stuck/ask/{}"  # the notebook's n-th question
ANSWER = "neuron_lab/stuck/{}/{}"  # rank r's answer to question n
IDLE_WAIT_S = 3600.0  # a rank's thread waits this long for a question, then waits again
ANSWER_S = 3.0  # the notebook waits this long for the ranks' answers (a dead or wedged rank gives none)
POLL_S = 0.05


def serve(rank: int, where: Callable[[], dict[str, Any]], env: dict[str, str] | None = None) -> threading.Thread:
    """Answer the notebook's questions from a daemon thread, for as long as the store is there: ``where()`` (called
    on that thread) says where the main thread is."""
    from torch.distributed import DistStoreError

    store = store_client(dict(os.environ) if env is None else env, IDLE_WAIT_S)

    def answer() -> None:
        n = 1
        while True:
            try:
                store.wait([ASK.format(n)])
            except DistStoreError:  # its wait timed out: no question yet
                continue
            except Exception:  # noqa: BLE001  (DistNetworkError: the store is gone, the ranks stopped)
                return
            try:
                store.set(ANSWER.format(n, rank), json.dumps({"rank": rank, **where()}))
            except Exception:  # noqa: BLE001  (the store went away while answering)
                return
            n += 1

    thread = threading.Thread(target=answer, name="neuron_lab: where is this rank", daemon=True)
    thread.start()
    return thread


def main_frame() -> Any:
    """The main thread's innermost frame (blocked or not)."""
    return sys._current_frames().get(threading.main_thread().ident)


def ask(store: Any, n: int, ranks: list[int], wait_s: float = ANSWER_S) -> dict[int, dict[str, Any]]:
    """Ask question ``n`` in ``store`` (the master's TCPStore) and collect the answers of ``ranks`` given within
    ``wait_s``: rank -> its answer."""
    store.set(ASK.format(n), "1")
    keys = {r: ANSWER.format(n, r) for r in ranks}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not store.check(list(keys.values())):
        time.sleep(POLL_S)
    return {r: json.loads(store.get(k)) for r, k in keys.items() if store.check([k])}
