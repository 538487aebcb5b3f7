"""Stage 0 process: the talker of the profile's backend, stepped until the engine says stop."""
from __future__ import annotations

import os

from engine.procs import Owner, close_queues
from engine.messages import Add, Abort, Ready, Stop
from engine.model_runner import CapacityError
from engine.stage_loop import Heart, drain, fatal, setup_torch, stall_forever
from engine.torch_talker import TorchTalker


def make_talker(profile, handoff_q, out_q, faults=()) -> TorchTalker:
    """Stage 0 on the backend the profile names."""
    if profile.config.backend == "vllm":
        from engine.vllm_talker import VllmTalker

        return VllmTalker(profile, handoff_q, out_q, faults)
    return TorchTalker(profile, handoff_q, out_q, faults)


def run(profile, queues, owner: Owner, faults=()) -> None:
    in_q, handoff_q, out_q = queues
    setup_torch()
    try:
        talker = make_talker(profile, handoff_q, out_q, faults)
        out_q.put(Ready(0, talker.info()))
        Heart(out_q, 0, profile.config.watchdog.heartbeat_interval_s, talker.stats, owner).start()
        while True:
            if talker.faults.stalled(talker.steps):
                stall_forever()
            if talker.faults.should_die(talker.finished, max((len(s.frames) for s in talker.running), default=0)):
                os._exit(1)
            for msg in drain(in_q, block=not talker.busy, owner=owner):
                match msg:
                    case Add(request):
                        with talker.isolated(request.request_id):
                            talker.add(request)
                    case Abort(request_id):
                        talker.abort(request_id)
                    case Stop():
                        talker.close()
                        handoff_q.put(Stop())
                        close_queues(handoff_q, out_q)   # their feeders do not hold up exit: flush them now
                        return
            if talker.busy:
                try:
                    talker.step()
                except CapacityError:
                    raise
                except Exception:
                    talker.fail_step()
    except SystemExit:
        raise
    except CapacityError as e:   # a configuration problem: the message is the whole story
        fatal(out_q, 0, f"CapacityError: {e}")
        raise SystemExit(1)
    except BaseException:
        fatal(out_q, 0)
        raise
