"""`lanekeeper synth`: one request through the engine, written as a WAV file."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import soundfile as sf

from engine.profile.axes import axis_overrides
from engine.profile.location import profile_source
from engine.profile.resolve import resolve
from engine.errors import UserError
from engine.serve.argtypes import output_file


def read_audio(path: str) -> tuple[np.ndarray, int]:
    """Mono float32 and its sample rate; a UserError naming the file when it is not audio."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--ref-audio {path}: no such file")
    try:
        audio, sr = sf.read(str(p), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise UserError(f"--ref-audio {path}: not a readable audio file ({e})") from None
    if audio.shape[0] == 0:
        raise UserError(f"--ref-audio {path}: the file holds no samples")
    return audio.mean(axis=1), sr


def cmd_synth(args) -> int:
    from engine.request import SpeechRequest   # the request and the engine import torch; `--help` need not
    from engine.runtime.engine import TTSEngine

    overrides = axis_overrides(args.runner, args.cuda_graph, args.handoff)
    if args.preset:
        overrides.append(f"model.preset={args.preset}")
    profile = resolve(args.profile, platform=args.platform, overrides=overrides + args.overrides)
    print(f"lanekeeper: profile {profile.name} from {profile.path} ({profile_source().origin})", flush=True)
    ref_audio, ref_sr = read_audio(args.ref_audio) if args.ref_audio else (None, 24000)
    task = args.task or ("Base" if args.ref_audio else "VoiceDesign" if args.instructions else "CustomVoice")
    request = SpeechRequest(text=args.text, task_type=task, voice=args.voice, instructions=args.instructions,
                            ref_audio=ref_audio, ref_sample_rate=ref_sr, ref_text=args.ref_text,
                            language=args.language, seed=args.seed, temperature=args.temperature)
    request.validate()
    t0 = time.monotonic()
    with TTSEngine(profile, cpu_fallback=args.cpu_fallback) as engine:
        started = time.monotonic() - t0
        (result,) = engine.generate([request])
    if not result.ok:
        print(f"lanekeeper: synthesis failed: {result.error.message}")
        return 1
    sf.write(args.output, result.audio, result.sample_rate, subtype="PCM_16")
    print(f"wrote {args.output}: {len(result.codes)} frames, {result.duration_s:.2f} s of audio at "
          f"{result.sample_rate} Hz ({profile.config.model_runner}, "
          f"{'eager' if profile.stage(0).enforce_eager else 'cuda graphs'}, "
          f"{'async_chunk' if profile.config.async_chunk else 'full_payload'}; engine start {started:.1f}s, "
          f"synthesis {result.timings.get('total_s', 0):.2f}s)")
    return 0


def add_parser(sub, profile_args) -> None:
    p = sub.add_parser("synth", help="synthesize one utterance to a WAV file")
    p.add_argument("text", help="what to say")
    p.add_argument("-o", "--output", required=True, type=output_file(".wav", ".flac"),
                   help="output audio file, .wav or .flac (checked before the engine starts)")
    profile_args(p)
    p.add_argument("--runner", choices=("v1", "v2"), help="model runner (default: the profile's)")
    p.add_argument("--cuda-graph", choices=("on", "off"), help="CUDA graphs on or off (default: the profile's)")
    p.add_argument("--handoff", choices=("async_chunk", "full_payload"),
                   help="stage handoff mode (default: the profile's)")
    p.add_argument("--task", choices=("CustomVoice", "VoiceDesign", "Base"),
                   help="task type (default: Base with --ref-audio, VoiceDesign with --instructions, else CustomVoice)")
    p.add_argument("--voice", default="vivian", help="speaker (CustomVoice task; default: %(default)s)")
    p.add_argument("--instructions", help="free-text voice description (VoiceDesign task)")
    p.add_argument("--ref-audio", help="reference audio file (Base task)")
    p.add_argument("--ref-text", help="transcript of the reference audio (Base task)")
    p.add_argument("--language", default="auto", help="language of the text (default: %(default)s)")
    p.add_argument("--preset", choices=("tiny", "0.6b"), help="model size preset (default: the profile's)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--temperature", type=float, help="sampling temperature; 0 is greedy (default: the profile's)")
    p.set_defaults(func=cmd_synth)
