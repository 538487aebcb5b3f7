"""The engine watchdog: turns a stalled handoff, a stalled stage or a dead stage into a
named, structured failure of the affected requests within seconds.

It reads what the engine already receives: each stage's heartbeats (with its progress
counters) and, per request, frames produced and handed off by stage 0 and consumed by
stage 1.  Deadlines come from the profile's `watchdog:` section.

- StageDied: a stage process exited.  Every in-flight request needs both stages.  This check
  always runs; `watchdog.enabled: false` turns off only the stall deadlines below.
- StageStall: a stage went quiet (no heartbeat), or has work and its progress counter
  has not moved for stage_deadline_s.
- StageHandoffStall: stage 0 handed off frames that stage 1 has not received after
  handoff_deadline_s, while stage 1 sits idle with an empty inbox: the frames are lost.
"""
from __future__ import annotations

import collections
import threading
import time

# Every diagnosis made in this process, newest last: the pytest plugin reads it for reports.
DIAGNOSES: collections.deque = collections.deque(maxlen=1000)


class Watchdog(threading.Thread):
    def __init__(self, engine, tick: float = 0.2):
        super().__init__(name="lanekeeper-watchdog", daemon=True)
        self.engine, self.tick = engine, tick
        self.cfg = engine.profile.config.watchdog
        self.names = {sid: engine.profile.stage_name(sid) for sid in (0, 1)}
        self.counters: dict[int, tuple[object, float]] = {}   # stage -> (progress counter, when it last moved)

    def run(self) -> None:
        while not self.engine.closed:
            try:
                self.check(time.monotonic())
            except Exception as e:   # the watchdog must outlive any one bad tick
                print(f"lanekeeper watchdog: {e!r}", flush=True)
            time.sleep(self.tick)

    def _moved(self, stage: int, counter, now: float) -> float:
        """Seconds since the stage's progress counter last changed."""
        last = self.counters.get(stage)
        if last is None or last[0] != counter:
            self.counters[stage] = (counter, now)
            return 0.0
        return now - last[1]

    def check(self, now: float) -> None:
        eng = self.engine
        tracked = eng.tracked()
        for stage in eng.dead_stages():
            if tracked and not eng.closed:
                code = eng.procs[stage].exitcode
                self.fail("StageDied", stage, tracked, 0.0,
                          f"stage {stage} ({self.names[stage]}) exited with code {code}", exitcode=code)
            return
        if not tracked or not self.cfg.enabled:
            self.counters.clear()
            return
        beats = eng.beats
        for stage in (0, 1):
            seen = beats[stage][0]   # every stage beat at least once: its ready
            if now - seen > self.cfg.stage_deadline_s:
                self.fail("StageStall", stage, tracked, now - seen,
                          f"stage {stage} ({self.names[stage]}) sent no heartbeat for {now - seen:.1f}s")
                return
        s0 = beats.get(0, (0, {}))[1]
        quiet0 = self._moved(0, s0.get("steps"), now)
        in_stage0 = [t for t in tracked if not t.stage0_done]
        if s0.get("depth", 0) and in_stage0 and quiet0 > self.cfg.stage_deadline_s:
            self.fail("StageStall", 0, in_stage0, quiet0,
                      f"stage 0 ({self.names[0]}) holds {len(in_stage0)} request(s) and made no step for {quiet0:.1f}s")
            return
        s1 = beats.get(1, (0, {}))[1]
        quiet1 = self._moved(1, s1.get("windows"), now)
        inbox = eng.handoff_backlog()
        waiting = [t for t in tracked if t.pending_since is not None
                   and now - t.pending_since > self.cfg.handoff_deadline_s]
        if not waiting:
            return
        if not s1.get("busy") and inbox == 0:
            for t in waiting:
                self.fail("StageHandoffStall", 1, [t], now - t.pending_since,
                          f"stage 1 ({self.names[1]}) waited {now - t.pending_since:.1f}s for frames that stage 0 handed "
                          f"off and that never arrived", group=waiting)
        elif quiet1 > self.cfg.stage_deadline_s:
            self.fail("StageStall", 1, waiting, quiet1,
                      f"stage 1 ({self.names[1]}) has {inbox} window(s) queued and decoded none for {quiet1:.1f}s")

    def fail(self, kind: str, stage: int, affected: list, seconds: float, message: str, group=None, **extra) -> None:
        eng, prof = self.engine, self.engine.profile
        ids = [t.request.request_id for t in (group or affected)]
        for t in affected:
            diagnosis = {
                "kind": kind, "stage": stage, "stage_name": self.names[stage],
                "request_id": t.request.request_id, "request_ids": ids,
                "frames_produced": t.produced, "frames_handed_off": t.handed_off, "frames_consumed": t.consumed,
                "seconds_since_progress": round(seconds, 2),
                "seconds_since_submit": round(time.monotonic() - t.submitted, 2),
                "runner": prof.config.model_runner, "cuda_graph": "off" if prof.stage(0).enforce_eager else "on",
                "handoff": "async_chunk" if prof.config.async_chunk else "full_payload",
                "cell": prof.cell, "profile": prof.name, **extra,
            }
            diagnosis["message"] = (f"{kind}: {message} (request {t.request.request_id}: produced {t.produced}, "
                                    f"handed off {t.handed_off}, consumed {t.consumed}; cell {prof.cell}, "
                                    f"profile {prof.name})")
            DIAGNOSES.append((time.time(), diagnosis))
            eng.fail_request(t.request.request_id, diagnosis)
