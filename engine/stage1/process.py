"""Stage 1 process: code2wav, decoding handed-off windows until stage 0 says stop."""
from __future__ import annotations

import os

from engine.process.owner import Owner
from engine.process.queues import close_queues
from engine.stage.loop import Heart, fatal, setup_torch, stall_forever
from engine.stage.messages import Abort, Frames, Ready, Stop
from engine.stage1.code2wav import MAX_ROWS, Code2Wav
from engine.stage1.gather import gather


def run(profile, queues, owner: Owner, faults=()) -> None:
    _, handoff_q, out_q = queues
    setup_torch()
    try:
        worker = Code2Wav(profile, out_q, faults)
        wait_s = profile.stage(1).max_batch_wait_ms / 1000
        out_q.put(Ready(1))
        Heart(out_q, 1, profile.config.watchdog.heartbeat_interval_s, worker.stats, owner).start()
        def check_faults() -> None:
            if worker.faults.should_die(worker.finished, worker.frames):
                os._exit(1)
            if worker.faults.stalled(worker.windows):
                stall_forever()

        while True:
            check_faults()
            pending: list[Frames] = []   # decoded together, up to the next message that is not a window
            for msg in gather(handoff_q, owner, wait_s, worker.open_streams, MAX_ROWS):
                match msg:
                    case Frames():
                        pending.append(msg)
                        continue
                worker.decode(pending, check_faults)
                pending = []
                match msg:
                    case Abort(request_id):
                        worker.abort(request_id)
                    case Stop():
                        close_queues(out_q)   # its feeder does not hold up exit: flush it now
                        return
            worker.decode(pending, check_faults)
    except SystemExit:
        raise
    except BaseException:
        fatal(out_q, 1)
        raise
