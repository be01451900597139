"""How the batch completer gathers the slots' requests into batches (no database: the
statements are stand-ins that record what they were sent)."""

from __future__ import annotations

import threading

from runyard.queue.completer import _Gatherer

WINDOW = 10.0  # long: a batch leaves once every busy slot is in it, never by the clock here


class Recorder:
    """Stand-in statements: a batch's answer is each item doubled; every call recorded."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.calls: list[list[int]] = []
        self.lock = threading.Lock()
        self.hold = hold
        self.sent = threading.Event()

    def many(self, items: list[int]) -> list[int]:
        self.sent.set()
        if self.hold is not None:
            self.hold.wait(10)
        with self.lock:
            self.calls.append(sorted(items))
        return [item * 2 for item in items]

    def one(self, item: int) -> int:
        return self.many([item])[0]


def ask_all(gatherer: _Gatherer[int, int], items: list[int]) -> dict[int, int]:
    answers: dict[int, int] = {}

    def ask(item: int) -> None:
        answers[item] = gatherer.ask(item)

    threads = [threading.Thread(target=ask, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    return answers


def test_gatherer__busy_slots_share_one_batch_and_each_gets_its_own_answer():
    recorder = Recorder()
    gatherer: _Gatherer[int, int] = _Gatherer(recorder.many, recorder.one, lambda: 4, WINDOW)
    assert ask_all(gatherer, [1, 2, 3, 4]) == {1: 2, 2: 4, 3: 6, 4: 8}
    assert recorder.calls == [[1, 2, 3, 4]] and gatherer.batches == 1


def test_gatherer__a_lone_slot_goes_at_once():
    recorder = Recorder()
    gatherer: _Gatherer[int, int] = _Gatherer(recorder.many, recorder.one, lambda: 1, WINDOW)
    assert gatherer.ask(5) == 10
    assert recorder.calls == [[5]]


def test_gatherer__requests_of_two_keys_never_share_a_batch():
    recorder = Recorder()
    # The second key's batch waits out its window for busy slots that are in the first.
    gatherer: _Gatherer[int, int] = _Gatherer(
        recorder.many, recorder.one, lambda: 4, 0.2, key=lambda item: item % 2
    )
    assert ask_all(gatherer, [1, 2, 3, 4]) == {1: 2, 2: 4, 3: 6, 4: 8}
    assert all(len({item % 2 for item in call}) == 1 for call in recorder.calls)
    assert sorted(item for call in recorder.calls for item in call) == [1, 2, 3, 4]


def test_gatherer__requests_made_while_a_batch_is_out_are_led_in_the_next():
    hold = threading.Event()
    recorder = Recorder(hold)
    gatherer: _Gatherer[int, int] = _Gatherer(recorder.many, recorder.one, lambda: 2, WINDOW)
    first = threading.Thread(target=ask_all, args=(gatherer, [1, 2]))
    first.start()
    assert recorder.sent.wait(10)  # the first batch is out, held
    later: dict[int, int] = {}
    second = threading.Thread(target=lambda: later.update(ask_all(gatherer, [3, 4])))
    second.start()
    hold.set()
    first.join(timeout=20)
    second.join(timeout=20)
    assert recorder.calls == [[1, 2], [3, 4]] and gatherer.batches == 2
    assert later == {3: 6, 4: 8}
