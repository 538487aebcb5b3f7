"""Engine unit tests that run in this process: models, sampling, handoff windows, runners."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.profile.resolve import resolve
from engine.stage0.handoff import HandoffPolicy
from engine.profile.schema import Connector
from engine.models.build import CheckpointError, build_models, save_checkpoint
from engine.models.code2wav import CausalConv
from engine.models.presets import PRESETS, SAMPLES_PER_FRAME
from engine.request import RequestError, SpeechRequest
from engine.stage0.sampling import DRAWN_FRAMES, RequestSampler, SamplingParams, SlotSampling, sample
from tests.helpers.reference import reference_run


@pytest.fixture(scope="module")
def codec():
    return build_models(parts=("codec",)).codec


def test_seeded_weights_are_reproducible_per_part():
    a, b = build_models(seed=3), build_models(seed=3, parts=("codec",))
    torch.testing.assert_close(a.codec.embeds, b.codec.embeds, rtol=0, atol=0)
    assert b.talker is None and not torch.equal(build_models(seed=4, parts=("codec",)).codec.embeds, b.codec.embeds)


@pytest.mark.parametrize("split", [1, 7, 25, 60])
def test_chunked_decode_equals_whole(codec, split):
    codes = torch.randint(0, 2048, (1, 90, 16))
    whole = codec(codes)
    left = 72
    pieces = [codec(codes[:, :split])]
    for start in range(split, 90, 25):
        ctx = max(0, start - left)
        out = codec(codes[:, ctx:start + 25], first_position=ctx)
        pieces.append(out[:, (start - ctx) * SAMPLES_PER_FRAME:])
    assert (torch.cat(pieces, 1) - whole).abs().max() < 1e-5


def test_a_right_padded_batch_decodes_each_row_as_alone(codec):
    """Stage 1 batches windows of different lengths and starts, padded on the right (and, on CUDA, to
    a captured row count): each row's samples are what decoding it alone gives."""
    lengths, starts = (1, 26, 97, 40), (0, 0, 5, 30)
    codes = [torch.randint(0, 2048, (n, 16)) for n in lengths]
    batch = torch.zeros(8, 128, 16, dtype=torch.long)
    for b, c in enumerate(codes):
        batch[b, :len(c)] = c
    first = torch.tensor(list(starts) + [0] * 4)
    together = codec(batch, first_position=first)
    for b, (c, start) in enumerate(zip(codes, starts)):
        alone = codec(c[None], first_position=start)[0]
        assert (together[b, :len(c) * SAMPLES_PER_FRAME] - alone).abs().max() < 1e-5, b


@pytest.mark.parametrize("dilation, groups, t", [(1, 1, 40), (3, 1, 40), (9, 1, 41), (9, 2, 45), (1, 4, 7)])
def test_causal_conv_is_a_left_padded_conv(dilation, groups, t):
    """Time-major, and folded when dilated, it computes what a left-padded Conv1d computes, at lengths
    that are and are not a whole number of folds."""
    conv = CausalConv(8, 4, 7, dilation, groups)
    x = torch.randn(2, t, 8)
    want = F.conv1d(F.pad(x.transpose(1, 2), (conv.pad, 0)), conv.conv.weight, conv.conv.bias, dilation=dilation,
                    groups=groups).transpose(1, 2)
    torch.testing.assert_close(conv(conv.padded(x))[:, :t], want)


def test_receptive_field_fits_left_context():
    """tiny streams exactly; 0.6b, like the real decoder, hears further back than the shipped context."""
    assert PRESETS["tiny"].codec.receptive_field <= 72 < PRESETS["0.6b"].codec.receptive_field


def test_receptive_field_is_where_the_audio_stops_changing(codec):
    """The computed reach is the measured one: changing the frame just beyond it leaves a frame's samples
    alone, changing the frame at its edge does not."""
    codec = copy.deepcopy(codec).double()   # the edge's effect is a few float32 ulps, which rounding can eat
    reach, t = codec.shape.receptive_field, codec.shape.receptive_field + 4
    codes = torch.randint(0, 2048, (1, t, 16))
    first = (t - 1) * SAMPLES_PER_FRAME
    base = codec(codes)[0, first:first + 1]
    for back, changes in ((reach + 1, False), (reach, True)):
        other = codes.clone()
        other[0, t - 1 - back] = (other[0, t - 1 - back] + 1) % 2048
        assert bool((codec(other)[0, first:first + 1] - base).abs().max() > 0) == changes, back


def test_too_little_context_changes_audio(codec):
    codes = torch.randint(0, 2048, (1, 40, 16))
    whole = codec(codes)
    cut = codec(codes[:, 30:], first_position=30)
    assert (cut - whole[:, 30 * SAMPLES_PER_FRAME:]).abs().max() > 1e-3


def _params(**kw):
    base = dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, min_tokens=2, max_tokens=100,
                stop_token_ids=(2150,), seed=0)
    return SamplingParams(**{**base, **kw})


class Rows:
    """Requests in slots 0..n-1, sampled codebook 0 at a time as a stage-0 step samples them."""

    def __init__(self, *params):
        self.samplers = [RequestSampler(p) for p in params]
        self.state = SlotSampling(len(params), torch.device("cpu"))
        for slot, sampler in enumerate(self.samplers):
            self.state.admit(slot, sampler)

    def first(self, logits: torch.Tensor) -> list[int]:
        slots = list(range(len(self.samplers)))
        self.state.prepare(slots, self.samplers)
        drawn = self.state.first(logits, torch.tensor(slots)).tolist()
        out = []
        for sampler, token in zip(self.samplers, drawn):
            token = sampler.params.stops[0] if sampler.must_stop() else token
            sampler.emitted(token)
            out.append(token)
        return out


def test_sampling_is_per_request():
    logits = torch.randn(1, 3072).repeat(3, 1)
    mixed = Rows(*(_params(seed=s) for s in (1, 2, 1)))
    first = [mixed.first(logits) for _ in range(5)]
    alone = Rows(_params(seed=1))
    assert [f[0] for f in first] == [alone.first(logits[:1])[0] for _ in range(5)] == [f[2] for f in first]
    assert [f[0] for f in first] != [f[1] for f in first]


def test_a_frame_draws_its_uniforms_at_once_in_codebook_order():
    """16 draws a frame from the request's own generator: the stream a draw per codebook would give,
    across the blocks of frames it draws at once."""
    sampler, gen = RequestSampler(_params(seed=9)), torch.Generator().manual_seed(9)
    for _ in range(DRAWN_FRAMES + 3):
        expected = torch.cat([torch.rand(1, generator=gen) for _ in range(16)])
        assert torch.equal(torch.from_numpy(sampler.uniforms()), expected)
    assert RequestSampler(_params(temperature=0.0)).uniforms() is None


def test_greedy_and_top_k_one():
    logits = torch.randn(3, 2048)
    u = torch.rand(3)
    picked = sample(logits, torch.tensor([0.0, 0.9, 5.0]), torch.tensor([50, 1, 1]), torch.tensor([1.0, 1.0, 0.3]), u)
    assert picked.tolist() == logits.argmax(-1).tolist()


def test_top_k_and_top_p_keep_their_nucleus():
    logits = torch.full((20, 2048), -10.0)
    logits[:, 5], logits[:, 9], logits[:, 11] = 5.0, 4.0, 3.9
    u = torch.linspace(0, 0.999, 20)
    ones = torch.ones(20)
    assert set(sample(logits, ones, torch.full((20,), 0), torch.full((20,), 0.5), u).tolist()) == {5}
    assert set(sample(logits, ones, torch.full((20,), 2), ones, u).tolist()) == {5, 9}
    assert set(sample(logits, ones, torch.full((20,), 3), ones, u).tolist()) == {5, 9, 11}


def test_eager_hints_change_no_token():
    """Uncaptured, a top-kmax replaces the full sort and the nucleus step is skipped: same tokens."""
    torch.manual_seed(0)
    logits, u, temp, top_p = torch.randn(6, 2048) * 3, torch.rand(6), torch.full((6,), 0.9), torch.ones(6)
    for top_k, kmax in ((torch.tensor([50, 5, 7, 50, 1, 50]), 50), (torch.tensor([50, 5, 0, 2048, 1, 9]), 2048)):
        full = sample(logits, temp, top_k, top_p, u)
        assert torch.equal(full, sample(logits, temp, top_k, top_p, u, kmax=kmax, nucleus=False))


def test_stop_rules():
    logits = torch.full((1, 3072), -5.0)
    logits[0, 2150] = 50.0   # the model wants to stop at once
    s = Rows(_params(min_tokens=2, temperature=0.0))
    assert s.first(logits) != [2150]       # min_tokens holds it back
    s.first(logits)
    assert s.first(logits) == [2150]
    t = Rows(_params(target_frames=3, temperature=0.0))
    assert [t.first(logits)[0] for _ in range(4)][-1] == 2150 and t.samplers[0].frames == 3
    m = Rows(_params(max_tokens=2, temperature=0.9, min_tokens=0))
    logits[0, 2150] = -50.0
    assert [m.first(logits)[0] for _ in range(3)][-1] == 2150 and m.samplers[0].uniforms() is None


def test_repetition_penalty_discourages_repeats():
    logits = torch.zeros(1, 3072)
    logits[0, 7], logits[0, 8] = 2.0, 1.95
    s = Rows(_params(temperature=0.0, repetition_penalty=1.5, min_tokens=0))
    assert s.first(logits) == [7] and s.first(logits) == [8]


def test_handoff_windows():
    conn = Connector(codec_chunk_frames=25, initial_codec_chunk_frames=1)
    frames = [np.zeros(16, dtype=np.int64)] * 60
    streaming, whole = HandoffPolicy(True, conn), HandoffPolicy(False, conn)
    assert streaming.window(frames[:1], 0, False, "r").codes.shape == (1, 16)
    assert streaming.window(frames[:20], 1, False, "r") is None
    w = streaming.window(frames[:26], 1, False, "r")
    assert (w.start, len(w.codes), w.final) == (1, 25, False)
    last = streaming.window(frames, 51, True, "r")
    assert (last.start, len(last.codes), last.final) == (51, 9, True)
    assert whole.window(frames[:59], 0, False, "r") is None
    full = whole.window(frames, 0, True, "r")
    assert (full.start, len(full.codes), full.final) == (0, 60, True)


@pytest.mark.parametrize("overrides", [["model_runner=v2"], ["model_runner=v2", "stages.0.enforce_eager=true"],
                                       ["model_runner=v1"]])
def test_runners_agree_in_process(overrides):
    from tests.helpers.reference import Inbox
    from engine.stage.messages import Codes
    from engine.stage0.process import make_talker

    profile = resolve("qwen3_tts", platform="cpu", overrides=overrides + ["stages.0.max_num_seqs=3"])
    out = Inbox()
    talker = make_talker(profile, Inbox(), out)
    reqs = [SpeechRequest("runner check " * k, temperature=0.0, seed=k) for k in (1, 2, 3, 4)]
    for r in reqs:
        talker.add(r)
    while talker.busy:
        talker.step()
    codes = {m.request_id: m.codes for m in out if isinstance(m, Codes)}
    for r in reqs:
        np.testing.assert_array_equal(codes[r.request_id], reference_run(r)[0])


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_request_is_launched_once_a_frame_and_once_for_its_stop(runner):
    """A step is launched before the one ahead of it is read back, so a request's end is read a step late; a
    forced stop (max_new_tokens, the synthetic length) is known at launch, and no step runs past it."""
    from tests.helpers.reference import Inbox
    from engine.stage.messages import Codes
    from engine.stage0.process import make_talker

    profile = resolve("qwen3_tts", platform="cpu", overrides=[f"model_runner={runner}", "stages.0.max_model_len=256"])
    out = Inbox()
    talker = make_talker(profile, Inbox(), out)
    text = "edge " * 30
    prompt = talker.backend.models.talker.prompt_embeds(SpeechRequest(text)).shape[0]
    # the longest request the KV cache takes (prompt, frames and the stop step), and two the synthetic length ends
    reqs = [SpeechRequest(text, seed=3, max_new_tokens=256 - prompt - 1), SpeechRequest("short", seed=4),
            SpeechRequest("a little longer", seed=5, temperature=0.0)]
    for r in reqs:
        talker.add(r)
    seqs = list(talker.scheduler.waiting)
    while talker.busy:
        talker.step()
    done = {m.request_id: m for m in out if isinstance(m, Codes)}
    assert done[reqs[0].request_id].reason == "finished_length"
    assert len(done[reqs[0].request_id].codes) == 256 - prompt - 1
    for seq in seqs:
        assert seq.sampler.launched == len(seq.frames) + 1 == len(done[seq.request_id].codes) + 1


def test_alike_voice_clone_requests_each_finish():
    """Two requests with the same text and the same reference clip (arrays of their own, as two clients
    send them), the shorter ending first: it finishes, and the longer goes on to its own end."""
    from tests.helpers.reference import Inbox
    from engine.stage.messages import Codes
    from engine.stage0.process import make_talker

    out = Inbox()
    talker = make_talker(resolve("qwen3_tts", platform="cpu"), Inbox(), out)
    clip = np.random.default_rng(0).standard_normal(24000).astype(np.float32) * 0.1
    reqs = [SpeechRequest("the same words", task_type="Base", voice=None, ref_audio=clip.copy(), ref_text="hello",
                          max_new_tokens=n) for n in (None, 2)]
    for r in reqs:
        talker.add(r)
    while talker.busy:
        talker.step()
    done = {m.request_id: len(m.codes) for m in out if isinstance(m, Codes)}
    assert set(done) == {r.request_id for r in reqs}, list(out)
    assert done[reqs[1].request_id] == 2 < done[reqs[0].request_id]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the host waits for a device's stream only on CUDA")
@pytest.mark.parametrize("overrides", [
    ["model_runner=v2"], ["model_runner=v2", "stages.0.enforce_eager=true"], ["model_runner=v1"],
    ["model_runner=v1", "stages.0.enforce_eager=true"],
    ["model_runner=v2", "model.preset=0.6b", "model.dtype=bfloat16"]])
def test_stage0_waits_for_the_device_only_to_read_back(overrides):
    """A step is launched before the one ahead of it is read back, so anything else that waits for the stream
    (a blocking copy, `t[i] = number` on a CUDA tensor, `.item()`) waits for the step in flight and leaves the
    device idle for the host's turn.  Requests arrive mid-run, finish, and one is aborted, all with such waits
    made errors: only the read-back's own event may wait."""
    from tests.helpers.reference import Inbox
    from engine.stage.messages import Codes, StageError
    from engine.stage0.process import make_talker

    out = Inbox()
    talker = make_talker(resolve("qwen3_tts", platform="cuda", overrides=overrides + ["stages.0.max_num_seqs=8"]),
                         Inbox(), out)
    talker.add(SpeechRequest("first use", seed=0))   # pinned blocks and kernels made on first use
    while talker.busy:
        talker.step()
    reqs = [SpeechRequest("no waits " * k, seed=k, temperature=0.0 if k % 3 == 0 else None,
                          top_p=0.8 if k % 2 else None, max_new_tokens=4 * k if k % 4 == 0 else None)
            for k in range(1, 11)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for r in reqs[:4]:
            talker.add(r)
        for step in range(60):
            if step % 3 == 0 and len(reqs) > 4 + step // 3:
                talker.add(reqs[4 + step // 3])
            if step == 5:
                talker.abort(reqs[1].request_id)
            if talker.busy:
                talker.step()
        while talker.busy:
            talker.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        talker.close()
    failed = [m for m in out if isinstance(m, StageError)]
    assert not failed, failed[0].traceback
    done = {m.request_id for m in out if isinstance(m, Codes)}
    assert done >= {r.request_id for i, r in enumerate(reqs) if i != 1}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="codec passes are captured and pipelined only on CUDA")
def test_stage1_pipelined_passes_stream_each_windows_own_audio_and_wait_only_to_read_back():
    """Stage 1 launches a codec pass before it reads back the one ahead, and its captured passes share one
    memory pool: each window still gets its own audio (a stream equals its whole decode), and nothing but
    the read-back's event waits for the device."""
    from tests.helpers.reference import Inbox
    from engine.stage.messages import Frames, StageError
    from engine.stage1.code2wav import Code2Wav

    out = Inbox()
    worker = Code2Wav(resolve("qwen3_tts", platform="cuda"), out)
    assert worker.pool is not None
    rng = np.random.default_rng(0)
    streams = {f"r{i}": rng.integers(0, 100, (int(rng.integers(2, 140)), 16)) for i in range(40)}
    chunk = {rid: 0 for rid in streams}   # where each stream's next window starts
    calls = 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        while chunk:   # each call: the next window of every open stream (more than one pass holds)
            windows = []
            for rid, start in list(chunk.items()):
                codes = streams[rid]
                end = min(len(codes), 1 if start == 0 else start + 25)
                windows.append(Frames(rid, start, codes[start:end], end == len(codes)))
                chunk[rid] = end
                if end == len(codes):
                    del chunk[rid]
            worker.decode(windows)
            calls += 1
    finally:
        torch.cuda.set_sync_debug_mode(0)
    failed = [m for m in out if isinstance(m, StageError)]
    assert not failed, failed[0].traceback
    assert worker.passes > calls
    for rid, codes in streams.items():
        streamed = np.concatenate([m.audio for m in out if getattr(m, "request_id", None) == rid and hasattr(m, "index")])
        whole = worker.codec(torch.as_tensor(codes, device="cuda")[None])[0].float().cpu().numpy()
        assert streamed.shape == whole.shape, rid
        assert np.abs(streamed - whole).max() <= 1e-2 * np.abs(whole).max(), rid


def test_checkpoint_round_trip(tmp_path):
    models = build_models(seed=5)
    path = tmp_path / "tiny.safetensors"
    save_checkpoint(models, path)
    loaded = build_models(seed=99, checkpoint=str(path))
    for name in ("talker", "code_predictor", "codec"):
        for (k, a), (_, b) in zip(getattr(models, name).state_dict().items(),
                                  getattr(loaded, name).state_dict().items()):
            assert torch.equal(a, b), f"{name}.{k}"
    assert loaded.synthetic


def test_checkpoint_errors(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        build_models(checkpoint=str(bad))
    with pytest.raises(CheckpointError, match="not found"):
        build_models(checkpoint=str(tmp_path / "missing.safetensors"))


@pytest.mark.parametrize("kw,param", [
    (dict(text=""), "input"), (dict(text="x" * 5000), "input"), (dict(text="hi", voice="nobody"), "voice"),
    (dict(text="hi", task_type="Karaoke"), "task_type"), (dict(text="hi", task_type="VoiceDesign"), "instructions"),
    (dict(text="hi", task_type="Base", ref_text="x"), "ref_audio"),
    (dict(text="hi", task_type="Base", ref_audio=np.ones(10, np.float32)), "ref_text"),
    (dict(text="hi", language="klingon"), "language"), (dict(text="hi", max_new_tokens=0), "max_new_tokens"),
])
def test_request_validation(kw, param):
    with pytest.raises(RequestError) as err:
        SpeechRequest(**kw).validate()
    assert err.value.param == param


def test_v2_fits_its_kv_cache_to_the_budget_and_refuses_only_what_does_not_fit():
    import psutil
    from tests.helpers.reference import Inbox
    from engine.stage.messages import StageError
    from engine.stage0.kv_budget import CapacityError
    from engine.stage0.process import make_talker

    tiny = PRESETS["tiny"].talker
    per_position = 2 * tiny.layers * tiny.kv_heads * tiny.head_dim * 4   # float32 K and V
    util = 64 * 600 * per_position / psutil.virtual_memory().total        # room for about 600 positions a slot
    out = Inbox()
    talker = make_talker(resolve("qwen3_tts", platform="cpu", overrides=[f"stages.0.gpu_memory_utilization={util}"]),
                         Inbox(), out)
    assert talker.backend.capacity == 512 and talker.backend.info()["kv_positions"] == 512
    talker.add(SpeechRequest("x" * 700, seed=1))
    (refused,) = out
    assert isinstance(refused, StageError) and "512 positions of KV cache" in refused.message \
        and "stages.0.max_model_len=4096" in refused.message
    talker.add(SpeechRequest("short enough", seed=1, temperature=0.0))
    while talker.busy:
        talker.step()
    assert len(out) == 2 and out[-1].codes.shape[1] == 16
    with pytest.raises(CapacityError, match="lower stages.0.max_num_seqs"):
        make_talker(resolve("qwen3_tts", platform="cpu", overrides=["stages.0.gpu_memory_utilization=1e-9"]),
                    Inbox(), Inbox())
