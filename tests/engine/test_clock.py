"""A stage's clock: its parts add up to the time spent in them, a part inside another counted once."""
import itertools

from engine.stage import loop
from engine.stage.loop import Clock


def test_a_part_inside_another_takes_its_time_from_the_outer(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(ticks)))
    clock = Clock("decode", "readback")
    with clock.part("decode"):            # 0
        with clock.part("readback"):      # 1 .. 2
            pass
        with clock.part("readback"):      # 3 .. 4
            pass
    # decode: 0..1, 2..3, 4..5
    assert clock.seconds == {"decode": 3.0, "readback": 2.0}


def test_a_part_that_raises_is_still_counted(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(ticks)))
    clock = Clock("decode", "readback")
    try:
        with clock.part("decode"):
            with clock.part("readback"):
                raise RuntimeError
    except RuntimeError:
        pass
    with clock.part("readback"):
        pass
    assert clock.seconds == {"decode": 2.0, "readback": 2.0}
