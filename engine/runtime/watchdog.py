"""The engine watchdog: turns a stalled handoff, a stalled stage or a dead stage into a
named, structured failure of the affected requests within seconds.

It reads what the engine already receives: each stage's heartbeats (with its progress
counters) and, per request, frames produced and handed off by stage 0 and consumed by
stage 1.  Deadlines come from the profile's `watchdog:` section.

- StageDied: a stage process exited.  Every in-flight request needs both stages.  This check
  always runs; `watchdog.enabled: false` turns off only the stall deadlines below.
- StageStall: a stage went quiet (no heartbeat), or has work and its progress counter
  has not moved for stage_deadline_s.
- StageHandoffStall, on stage 1: stage 0 handed off frames that stage 1 has not received after
  handoff_deadline_s, while stage 1 sits idle with an empty inbox: the frames are lost.
- StageHandoffStall, on stage 0: stage 0 began handing off a window (its handoff counters say
  begun > done) and has not finished after handoff_deadline_s.  A stage that is slow to deliver
  is not a stage that stopped stepping; past stage_deadline_s it holds up every request of stage 0.

A dead stage, a silent one, or one that stopped progressing cannot serve any more request:
that is the engine's `verdict`, which the server's supervisor acts on (restart) and `/health`
reports.  A lost or late handoff fails its requests and leaves the engine serving.
"""
from __future__ import annotations

import threading
import time

from engine.diagnosis import Diagnosis
from engine.runtime.registry import REGISTRY
from engine.stage.stats import Code2WavStats, TalkerStats


class Watchdog(threading.Thread):
    def __init__(self, engine, tick: float = 0.2):
        super().__init__(name="lanekeeper-watchdog", daemon=True)
        self.engine, self.tick = engine, tick
        self.cfg = engine.profile.config.watchdog
        self.names = {sid: engine.profile.stage_name(sid) for sid in (0, 1)}
        self.counters: dict[int, tuple[object, float]] = {}   # stage -> (progress counter, when it last moved)
        self.verdict: Diagnosis | None = None   # why the engine cannot serve any more, once it cannot

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

    def condemn(self, kind: str, stage: int, message: str, seconds: float = 0.0, **extra) -> None:
        """Record why this engine cannot serve any more; the first reason is kept."""
        if self.verdict is None:
            prof = self.engine.profile
            self.verdict = Diagnosis(kind=kind, message=f"{kind}: {message}", stage=stage,
                                     stage_name=self.names[stage], seconds_since_progress=round(seconds, 2),
                                     profile=prof.name, cell=prof.cell, **extra)

    def check(self, now: float) -> None:
        eng = self.engine
        tracked = eng.tracked()
        for stage in eng.dead_stages():
            code = eng.procs[stage].exitcode
            message = f"stage {stage} ({self.names[stage]}) exited with code {code}"
            if not eng.closed:
                self.condemn("StageDied", stage, message, exitcode=code)
            if tracked and not eng.closed:
                self.fail("StageDied", stage, tracked, 0.0, message, exitcode=code)
            return
        if not self.cfg.enabled:
            return
        beats = eng.beats
        for stage in (0, 1):
            silent = now - beats[stage][0]   # every stage beat at least once: its ready
            if silent > self.cfg.stage_deadline_s:
                message = f"stage {stage} ({self.names[stage]}) sent no heartbeat for {silent:.1f}s"
                self.condemn("StageStall", stage, message, silent)
                if tracked:
                    self.fail("StageStall", stage, tracked, silent, message)
                return
        if not tracked:
            self.counters.clear()
            return
        s0: TalkerStats = beats[0][1]
        quiet0 = self._moved(0, s0.steps, now)
        in_stage0 = [t for t in tracked if not t.stage0_done]
        if s0.handoffs_begun > s0.handoffs_done:
            self._handing_off(s0, in_stage0, quiet0)
        elif s0.depth and in_stage0 and quiet0 > self.cfg.stage_deadline_s:
            message = f"stage 0 ({self.names[0]}) holds {len(in_stage0)} request(s) and made no step for {quiet0:.1f}s"
            self.condemn("StageStall", 0, message, quiet0)
            self.fail("StageStall", 0, in_stage0, quiet0, message)
            return
        s1: Code2WavStats = beats[1][1]
        quiet1 = self._moved(1, s1.windows, now)
        inbox = eng.handoff_backlog()
        waiting = [t for t in tracked if t.pending_since is not None
                   and now - t.pending_since > self.cfg.handoff_deadline_s]
        if not waiting:
            return
        if not s1.busy and inbox == 0:
            for t in waiting:
                self.fail("StageHandoffStall", 1, [t], now - t.pending_since,
                          f"stage 1 ({self.names[1]}) waited {now - t.pending_since:.1f}s for frames that stage 0 handed "
                          f"off and that never arrived", group=waiting)
        elif quiet1 > self.cfg.stage_deadline_s:
            message = f"stage 1 ({self.names[1]}) has {inbox} window(s) queued and decoded none for {quiet1:.1f}s"
            self.condemn("StageStall", 1, message, quiet1)
            self.fail("StageStall", 1, waiting, quiet1, message)

    def _handing_off(self, s0: TalkerStats, in_stage0: list, quiet: float) -> None:
        """Stage 0 is inside a handoff: the request being handed off fails at the handoff deadline, the rest of
        stage 0's requests (held up behind it) at the stage deadline."""
        rid = s0.handoff_request
        message = (f"stage 0 ({self.names[0]}) has been handing off a window of request {rid} to stage 1 "
                   f"({self.names[1]}) for {quiet:.1f}s")
        if quiet > self.cfg.stage_deadline_s:
            self.condemn("StageHandoffStall", 0, message, quiet)
            self.fail("StageHandoffStall", 0, in_stage0, quiet, message)
        elif quiet > self.cfg.handoff_deadline_s:
            self.fail("StageHandoffStall", 0, [t for t in in_stage0 if t.request.request_id == rid], quiet,
                      message + f" (handoff deadline {self.cfg.handoff_deadline_s:g}s)")

    def fail(self, kind: str, stage: int, affected: list, seconds: float, message: str, group=None, **extra) -> None:
        eng, prof = self.engine, self.engine.profile
        ids = tuple(t.request.request_id for t in (group or affected))
        for t in affected:
            rid = t.request.request_id
            diagnosis = Diagnosis(
                kind=kind, stage=stage, stage_name=self.names[stage], request_id=rid, request_ids=ids,
                frames_produced=t.produced, frames_handed_off=t.handed_off, frames_consumed=t.consumed,
                seconds_since_progress=round(seconds, 2), seconds_since_submit=round(time.monotonic() - t.submitted, 2),
                cell=prof.cell, profile=prof.name, **extra,
                message=(f"{kind}: {message} (request {rid}: produced {t.produced}, handed off {t.handed_off}, "
                         f"consumed {t.consumed}; cell {prof.cell}, profile {prof.name})"))
            REGISTRY.record(diagnosis)
            eng.fail_request(rid, diagnosis)
