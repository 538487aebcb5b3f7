"""The reference every matrix cell must reproduce: greedy codes and whole-payload audio, computed in
the test process on the simplest path (runner v1, eager, one request at a time)."""
import dataclasses

import numpy as np

from engine.profile.resolve import resolve
from engine.stage.messages import Codes


def check_as_shipped(engine, request, record_property):
    """One request through the profile as shipped; the engine runs the runner the profile names."""
    profile = engine.profile
    record_property("profile", profile.name)
    record_property("runner", engine.info[0]["runner"])
    assert engine.info[0]["runner"] == profile.config.model_runner, \
        f"{profile.name} names runner {profile.config.model_runner}, stage 0 runs {engine.info[0]['runner']}"
    (result,) = engine.generate([request])
    assert result.ok and len(result.audio) > 0, result.error
    return result


class Inbox(list):
    put = list.append


def reference_runs(requests, backend="torch", profile_name="qwen3_tts"):
    """Greedy codes and whole-payload audio for each request, computed in this process.

    Runner v1, eager, one request at a time, and one codec decode over the whole sequence:
    the simplest path through the same models (on the same stage-0 backend), which every
    matrix cell must reproduce.
    """
    # torch and the models load here, in the runs whose tests ask for a reference: the others (a lane's
    # as-shipped test, say) start their engines without loading torch into the test process
    import torch

    from engine.models.build import build_models
    from engine.stage0.process import make_talker

    profile = resolve(profile_name, platform="cpu",
                      overrides=["model_runner=v1", "stages.0.enforce_eager=true", f"backend={backend}"])
    codec = build_models(parts=("codec",)).codec
    out = Inbox()
    talker = make_talker(profile, Inbox(), out)
    try:
        runs = []
        for request in requests:
            talker.add(request)
            while talker.busy:
                talker.step()
            (codes,) = [m.codes for m in out if isinstance(m, Codes) and m.request_id == request.request_id]
            runs.append((codes, codec(torch.as_tensor(codes)[None])[0].numpy()))
        return runs
    finally:
        talker.close()


def reference_run(request):
    return reference_runs([request])[0]


def assert_matches_reference(engine, greedy_reference, task: str, request_id: str):
    """The cell's greedy codes equal the reference's; its audio is within 1e-3 of a whole-payload decode."""
    req, codes, audio = greedy_reference[task]
    (result,) = engine.generate([dataclasses.replace(req, request_id=request_id)])
    assert result.ok and len(result.audio) > 0, result.error
    np.testing.assert_array_equal(result.codes, codes)
    assert np.abs(result.audio - audio).max() < 1e-3
    return codes
