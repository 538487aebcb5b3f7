"""multiprocessing queues that never hold up an exit."""
from __future__ import annotations


def close_queues(*queues) -> None:
    """Close multiprocessing queues without waiting on a reader that is gone."""
    for q in queues:
        q.cancel_join_thread()   # a feeder blocked on a pipe nobody reads must not hold up close...
        q.close()
        feeder = getattr(q, "_thread", None)
        if feeder is not None:   # ...but one that is only finishing gets a moment: it holds the queue's
            feeder.join(1.0)     # semaphores, and a daemon thread cut off at exit leaks them


class ClosedQueue:
    """Stands in for a closed queue: any use raises `error(message)`."""

    def __init__(self, message: str, error=RuntimeError):
        self.message, self.error = message, error

    def put(self, item):
        raise self.error(self.message)

    def get(self, *a, **kw):
        raise self.error(self.message)
