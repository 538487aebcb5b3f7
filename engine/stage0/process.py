"""Stage 0 process: the talker on the profile's backend, stepped until the engine says stop."""
from __future__ import annotations

import os
from contextlib import nullcontext

from engine.process.owner import Owner
from engine.process.queues import close_queues
from engine.stage.loop import Heart, drain, fatal, setup_torch, stall_forever
from engine.stage.messages import Abort, Add, Ready, Stop
from engine.stage0.backend import Backend
from engine.stage0.kv_budget import CapacityError
from engine.stage0.talker import Talker
from engine.stage0.torch_backend import TorchBackend
from engine.stage0.vllm_backend import VllmBackend

BACKENDS: dict[str, type[Backend]] = {"torch": TorchBackend, "vllm": VllmBackend}


def make_talker(profile, handoff_q, out_q, faults=()) -> Talker:
    """Stage 0 on the backend the profile names."""
    return Talker(profile, BACKENDS[profile.config.backend](profile), handoff_q, out_q, faults)


def _handle(talker: Talker, msg, handoff_q, out_q) -> bool:
    """One message from the engine; False once it says stop."""
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
            return False
    return True


def run(profile, queues, owner: Owner, faults=()) -> None:
    in_q, handoff_q, out_q = queues
    setup_torch()
    try:
        talker = make_talker(profile, handoff_q, out_q, faults)
        out_q.put(Ready(0, talker.backend.info()))
        Heart(out_q, 0, profile.config.watchdog.heartbeat_interval_s, talker.stats, owner).start()
        while True:
            if talker.faults.stalled(talker.steps):
                stall_forever()
            if talker.faults.should_die(talker.finished, talker.longest()):
                os._exit(1)
            with talker.clock.part("inbox") if talker.busy else nullcontext():
                for msg in drain(in_q, block=not talker.busy, owner=owner):
                    if not _handle(talker, msg, handoff_q, out_q):
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
