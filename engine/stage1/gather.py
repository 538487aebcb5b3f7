"""Which messages stage 1 takes from its inbox for its next codec passes.

A pass has a fixed part, paid once however many windows it holds, so while many streams are
open, waiting a few milliseconds for the windows about to arrive decodes more audio a device
second.  Only audio a client already has some of waits: a window that starts a stream (its
request's first audio) ends the wait, as does any message other than a window.  Nor does stage 1
wait when no stream is open besides those in hand: then nothing is coming but new requests.
"""
from __future__ import annotations

import queue
import time
from typing import Callable

from engine.process.owner import Owner
from engine.stage.loop import drain
from engine.stage.messages import Frames


def gather(inbox, owner: Owner, wait_s: float, open_streams: Callable[[], set[str]], most: int) -> list:
    """What is in the inbox (blocking a little while it is empty), and what arrives within wait_s while
    waiting is worth it, up to `most` messages."""
    msgs = drain(inbox, block=True, owner=owner)
    deadline = time.monotonic() + wait_s
    while len(msgs) < most and _worth_waiting(msgs, open_streams):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            msgs.append(inbox.get(timeout=left))
        except queue.Empty:
            break
        msgs += drain(inbox, block=False, owner=owner)
    return msgs


def _worth_waiting(msgs: list, open_streams: Callable[[], set[str]]) -> bool:
    if not msgs or not all(isinstance(m, Frames) and m.start > 0 for m in msgs):
        return False
    return bool(open_streams() - {m.request_id for m in msgs})
