"""Where a stuck rank is, asked out-of-band (session.stuck): a rank's thread answers each question through the store
the notebook hosts (the rank with its main thread really blocked in a collective: tests/test_ranks.py)."""

from __future__ import annotations

from neuron_lab.session import launch, stuck


def test_a_rank_answers_each_question_and_a_rank_that_never_answers_is_left_out() -> None:
    store = launch.AgentStore()
    asked = []

    def where() -> dict:
        asked.append(1)
        return {"collective": None, "site": None}

    stuck.serve(3, where, {"MASTER_ADDR": launch.MASTER_ADDR, "MASTER_PORT": str(store.port)})
    assert stuck.ask(store.tcp, 1, [3]) == {3: {"rank": 3, "collective": None, "site": None}}
    assert stuck.ask(store.tcp, 2, [3, 4], wait_s=0.5) == {3: {"rank": 3, "collective": None, "site": None}}
    assert len(asked) == 2
