"""Stage 1 waits for more windows only where that costs no client its first audio: what `gather` takes."""
import os
import queue
import threading

import numpy as np
import pytest

from engine.process.owner import Owner
from engine.stage.messages import Abort, Frames
from engine.stage1.gather import gather

LONG = 600.0   # a wait that, taken, would show as a hang: the tests below must return without it


class Inbox(queue.Queue):
    """A queue that counts the gets that could block after something was already in hand."""

    def __init__(self, *msgs):
        super().__init__()
        self.waits = self.taken = 0
        for m in msgs:
            self.put(m)

    def get(self, block=True, timeout=None):
        if block and self.taken:
            self.waits += 1
        item = super().get(block, timeout)
        self.taken += 1
        return item


def window(rid: str, start: int) -> Frames:
    return Frames(rid, start, np.zeros((25, 16), dtype=np.int64), final=False)


def later(inbox: Inbox, msg, after_s: float = 0.05) -> threading.Timer:
    timer = threading.Timer(after_s, inbox.put, (msg,))
    timer.start()
    return timer


@pytest.fixture(scope="module")
def owner():
    return Owner(os.getpid())


def test_a_window_that_starts_a_stream_is_not_held(owner):
    first = window("a", 0)
    inbox = Inbox(first)
    assert gather(inbox, owner, LONG, lambda: {"a", "b", "c"}, 32) == [first]
    assert inbox.waits == 0


def test_a_lone_stream_does_not_wait(owner):
    w = window("a", 25)
    inbox = Inbox(w)
    assert gather(inbox, owner, LONG, lambda: {"a"}, 32) == [w]
    assert inbox.waits == 0


def test_windows_of_other_open_streams_join_until_none_is_left_to_come(owner):
    a, b = window("a", 25), window("b", 50)
    inbox = Inbox(a)
    later(inbox, b)
    assert gather(inbox, owner, LONG, lambda: {"a", "b"}, 32) == [a, b]


def test_a_first_window_arriving_during_the_wait_ends_it(owner):
    a, new = window("a", 25), window("n", 0)
    inbox = Inbox(a)
    later(inbox, new)
    assert gather(inbox, owner, LONG, lambda: {"a", "b"}, 32) == [a, new]


def test_any_other_message_ends_the_wait(owner):
    a, abort = window("a", 25), Abort("b")
    inbox = Inbox(a)
    later(inbox, abort)
    assert gather(inbox, owner, LONG, lambda: {"a", "b", "c"}, 32) == [a, abort]


def test_the_wait_ends_at_its_deadline(owner):
    a = window("a", 25)
    inbox = Inbox(a)
    assert gather(inbox, owner, 0.05, lambda: {"a", "b"}, 32) == [a]
    assert inbox.waits == 1


def test_no_wait_when_set_to_zero_or_a_pass_is_full(owner):
    a, b = window("a", 25), window("b", 25)
    inbox = Inbox(a)
    assert gather(inbox, owner, 0.0, lambda: {"a", "b"}, 32) == [a]
    inbox = Inbox(a, b)
    assert gather(inbox, owner, LONG, lambda: {"a", "b", "c"}, 2) == [a, b]
    assert inbox.waits == 0
