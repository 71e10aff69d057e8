"""The worker's fair queue (rag_worker/pipeline/admission.py) on plain threads: who gets a freed slot, when, and
how often a waiting turn is told its place."""

from __future__ import annotations

import threading
import time

from rag_worker.pipeline.admission import TurnQueue


def waiter(
    q: TurnQueue, since: float, said: list, got: list, hold_s: float = 0.0, *, answered: bool = False
) -> threading.Thread:
    """A thread that waits for a slot (recording each position it is told, with the time), holds it, frees it."""

    def run():
        for position in q.wait(since, answered=answered):
            said.append((time.monotonic(), position))
        got.append((since, time.monotonic()))
        time.sleep(hold_s)
        q.release()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_the_first_in_line_gets_a_freed_slot_at_once():
    q = TurnQueue(slots=1, max_queued=10)
    q.REPORT_S = q.HEARTBEAT_S = 30.0  # a waiter that only looked on its own clock would wait 30 s
    list(q.wait(0.0))  # the one slot, held
    said, got = [], []
    t = waiter(q, 1.0, said, got)
    while not said:
        time.sleep(0.01)
    freed = time.monotonic()
    q.release()
    t.join(5)
    assert got and got[0][1] - freed < 1.0
    assert said[0][1] == 1


def test_slots_go_in_order_of_arrival():
    q = TurnQueue(slots=1, max_queued=10)
    list(q.wait(0.0))
    got: list = []
    threads = [waiter(q, since, [], got) for since in (3.0, 1.0, 2.0)]
    time.sleep(0.2)  # all three in line
    q.release()
    for t in threads:
        t.join(5)
    assert [since for since, _ in got] == [1.0, 2.0, 3.0]


def test_a_turn_back_with_its_answer_lets_the_turns_just_behind_it_reach_their_first_token_first():
    """In a burst, the first turns' grounding checks would otherwise hold up every later turn's search: a turn that
    has its answer waits as if it had arrived ANSWERED_DEFER_S later, and is never passed by turns that arrived
    later than that (no turn's check waits for ever under a steady stream of new questions)."""
    q = TurnQueue(slots=1, max_queued=10)
    list(q.wait(0.0))
    got: list = []
    defer = TurnQueue.ANSWERED_DEFER_S
    threads = [waiter(q, 1.0, [], got, answered=True)]  # arrived first, back for its check
    time.sleep(0.05)
    threads += [waiter(q, since, [], got) for since in (1.5, 1.0 + defer + 0.5, 1.2)]  # searches
    time.sleep(0.2)  # all four in line
    q.release()
    for t in threads:
        t.join(5)
    assert [since for since, _ in got] == [1.2, 1.5, 1.0, 1.0 + defer + 0.5]


def test_a_waiting_turn_says_its_place_at_once_then_at_most_every_report_s():
    # Twenty turns ahead leave one by one, each holding its slot 20 ms: the last turn's place changes twenty times
    # in 0.4 s. It says where it stands at once, and then no more often than REPORT_S.
    q = TurnQueue(slots=1, max_queued=100)
    q.REPORT_S = 0.15
    list(q.wait(0.0))
    got: list = []
    ahead = [waiter(q, 1.0 + i, [], got, hold_s=0.02) for i in range(20)]
    time.sleep(0.3)
    said: list = []
    last = waiter(q, 100.0, said, got)
    while not said:
        time.sleep(0.01)
    q.release()
    for t in [*ahead, last]:
        t.join(10)
    assert said[0][1] == 21
    assert [p for _, p in said] == sorted((p for _, p in said), reverse=True)
    assert 2 <= len(said) <= 6, said
    assert all(b - a >= q.REPORT_S * 0.9 for (a, _), (b, _) in zip(said, said[1:], strict=False))
    assert len(got) == 21


def test_a_turn_that_leaves_the_line_hands_its_turn_on():
    q = TurnQueue(slots=1, max_queued=10)
    q.REPORT_S = q.HEARTBEAT_S = 30.0
    list(q.wait(0.0))
    first = q.wait(1.0)
    assert next(first) == 1
    said, got = [], []
    t = waiter(q, 2.0, said, got)
    while not said:
        time.sleep(0.01)
    q.release()  # the slot is the first waiter's, but it has gone
    first.close()
    t.join(5)
    assert got and q.stats() == {"slots": 1, "busy": 0, "waiting": 0}
