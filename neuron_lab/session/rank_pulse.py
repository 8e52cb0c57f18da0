"""Each rank's live counters for the notebook's dashboard, read while a cell runs on the ranks, on any host.

A rank's kernel is busy for the whole of a ``%%neuron ranks`` cell, so ipyparallel cannot ask it anything. As in
:mod:`~neuron_lab.session.stuck`, each rank keeps one daemon thread with its own client of the group's store (hosted by
the notebook, reached by every rank wherever it runs): it waits for the notebook's question and answers with what
moves on that rank (its device memory, the running cell's CPU fallback calls, the collective it waits in). The
notebook asks only while a dashboard reads the ranks, at the dashboard's own pace (``NeuronLab.widget_refresh_hz``):
no dashboard, no traffic.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from datetime import timedelta
from typing import Any

from neuron_lab import backend
from neuron_lab.session.launch import MASTER_ADDR, store_client
from neuron_lab.units import format_capacity

ASKED = "neuron_lab/pulse/asked"  # the number of the notebook's newest question (a store counter)
ASK = "neuron_lab/pulse/ask/{}"  # set once question n is asked: what a rank's thread waits for
ANSWER = "neuron_lab/pulse/{}"  # rank r's newest answer, with the question's number
WAIT_S = 10.0  # a rank's thread waits this long for the next question, then reads which one is newest
KEEP = 8  # asked keys kept: a rank that fell behind still finds the key it waits for (else WAIT_S catches it up)
SETTLE_S = 1.0  # after a cell, the notebook waits this long for every rank's fresh answer
SILENT_S = 5.0  # a rank whose last answer is older than a question asked this long ago is not answering
POLL_S = 0.02

RUNNING, IDLE, WAITING, SILENT, LOST, STOPPED = ("running", "idle", "waiting in {}", "not answering", "lost",
                                                 "stopped")


# -- on each rank ---------------------------------------------------------------------------------------------------
def serve(rank: int, session: Any, env: dict[str, str] | None = None) -> threading.Thread:
    """Answer the notebook's questions from a daemon thread, for as long as the group's store is there."""
    from torch.distributed import DistStoreError

    store = store_client(dict(os.environ) if env is None else env, WAIT_S)

    def answer() -> None:
        answered = 0
        while True:
            try:
                asked = store.add(ASKED, 0)
                if asked > answered:
                    store.set(ANSWER.format(rank), json.dumps({"n": asked, **reading(session)}))
                    answered = asked
                    continue
                store.wait([ASK.format(asked + 1)], timedelta(seconds=WAIT_S))
            except DistStoreError:  # no question within WAIT_S: read the counter again
                continue
            except Exception:  # noqa: BLE001  (DistNetworkError: the store is gone, the ranks stopped)
                return

    thread = threading.Thread(target=answer, name="neuron_lab: this rank's dashboard counters", daemon=True)
    thread.start()
    return thread


def reading(session: Any) -> dict[str, Any]:
    """What moves on this rank, safe from a thread: memory, the running (else the last) cell's fallback calls, and
    the collective the main thread is blocked in."""
    b = backend.active() if backend.is_active() else None
    allocated, peak = b.memory_sample(session.device) if b is not None else (0, 0)
    waiting = b.collective_waiting() if b is not None else None
    capacity = b.capacity() if b is not None else None
    said: dict[str, Any] = {"allocated": allocated, "peak": peak, "capacity": capacity,
                            "capacity_text": format_capacity(capacity), "busy": False,
                            "collective": waiting["op"] if waiting else None}
    tracker = session.running
    if tracker is not None:
        said.update(busy=True, cell=session.running_cell(), fallback_calls=tracker.live()[0])
    elif session.history:
        last = next(reversed(session.history.values()))
        said.update(cell=last.cell, fallback_calls=last.fallback_calls)
    return said


# -- in the notebook ------------------------------------------------------------------------------------------------
class Listener:
    """The notebook's side for one group of ranks (``session.ranks.Ranks``): asks, keeps each rank's newest answer,
    and makes the rows the dashboard shows."""

    def __init__(self, group: Any) -> None:
        from torch.distributed import TCPStore

        self.group = group
        self.store = TCPStore(MASTER_ADDR, group.store.port, is_master=False, timeout=timedelta(seconds=SILENT_S))
        self.heard: dict[int, dict[str, Any]] = {}  # rank -> its newest answer
        self.asks: collections.deque[tuple[int, float]] = collections.deque(maxlen=64)  # (question, when asked)
        self._lock = threading.Lock()  # the refresh thread and the main thread (a cell's end) both read

    def rows(self, settle: bool = False) -> list[dict[str, Any]]:
        """A row per rank, ordered by host then rank; asks first unless the group stopped (``settle``: waits up to
        :data:`SETTLE_S` for every live rank's answer to a fresh question, as at a cell's end)."""
        with self._lock:
            if not self.group.stopped:
                try:
                    self._ask(settle)
                except Exception:  # noqa: BLE001  (the store went away: the group is stopping)
                    pass
            return self._rows()

    def _ask(self, settle: bool) -> None:
        self._collect()
        awaited = [e.rank for e in self.group.engines  # not a rank that is gone or has stopped answering
                   if self._status(e, self.heard.get(e.rank, {})) not in (LOST, SILENT)]
        n = self.store.add(ASKED, 1)
        self.store.set(ASK.format(n), "")
        if n > KEEP:
            self.store.delete_key(ASK.format(n - KEEP))
        self.asks.append((n, time.monotonic()))
        deadline = time.monotonic() + (SETTLE_S if settle else 0)
        while any(self.heard.get(r, {}).get("n", 0) < n for r in awaited) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            self._collect()

    def _collect(self) -> None:
        """Each rank's newest answer: in one request once every rank has answered once (one per rank until then)."""
        keys = {e.rank: ANSWER.format(e.rank) for e in self.group.engines}
        if self.store.check(list(keys.values())):
            self.heard.update(zip(keys, map(json.loads, self.store.multi_get(list(keys.values()))), strict=True))
            return
        for rank, key in keys.items():
            if self.store.check([key]):
                self.heard[rank] = json.loads(self.store.get(key))

    def _rows(self) -> list[dict[str, Any]]:
        order = list(dict.fromkeys(e.host for e in self.group.engines))
        engines = sorted(self.group.engines, key=lambda e: (order.index(e.host), e.rank))
        return [{"rank": e.rank, "host": e.host, "device": e.device, **{k: v for k, v in said.items() if k != "n"},
                 "status": self._status(e, said)} for e in engines for said in [self.heard.get(e.rank, {})]]

    def _status(self, e: Any, said: dict[str, Any]) -> str:
        if self.group.stopped:
            return STOPPED
        if not e.alive():
            return LOST
        due = [t for n, t in self.asks if n > said.get("n", 0)]  # questions it has not answered yet
        if due and time.monotonic() - due[0] > SILENT_S:
            return SILENT
        if said.get("collective"):
            return WAITING.format(said["collective"])
        return RUNNING if said.get("busy") else IDLE

