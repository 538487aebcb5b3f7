"""The codec decoder's intrinsic cost: multiply-accumulates per second of audio, counted by
torch.utils.flop_counter over a whole (unchunked) decode, and its parameter count.

    python benchmarks/codec_cost.py --preset 0.6b

Streaming re-decodes each window's left context on top of this; the benchmarks report the
intrinsic figure so that codecs compare like for like.  `--parity` also decodes a sequence as
stage 1 streams it (the shipped chunking) and prints how far that is from one whole decode:
a codec whose receptive field is longer than the left context, as the real one's is, differs.

    python benchmarks/codec_cost.py --preset 0.6b --parity --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse

import torch
from torch.utils.flop_counter import FlopCounterMode

from engine.models.build import build_models
from engine.models.presets import SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.profile.resolve import resolve


def codec_cost(preset: str, seconds: int = 8) -> dict[str, float]:
    """GMAC per audio second over a `seconds`-long decode, and the parameter count in millions."""
    codec = build_models(preset, parts=("codec",)).codec
    frames = seconds * SAMPLE_RATE // SAMPLES_PER_FRAME
    codes = torch.randint(0, 2048, (1, frames, 16), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        codec(codes)
    return {"codec_gmac_per_audio_s": counter.get_total_flops() / 2 / 1e9 / seconds,
            "codec_params_m": sum(p.numel() for p in codec.parameters()) / 1e6}


def windows(frames: int, initial: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) of each streamed window: a short first one, then one every `chunk` frames."""
    bounds = [0, min(initial, frames)]
    while bounds[-1] < frames:
        bounds.append(min(bounds[-1] + chunk, frames))
    return list(zip(bounds, bounds[1:]))


@torch.no_grad()
def streaming_difference(preset: str, device: str = "cpu", dtype: str = "float32", seconds: int = 16) -> dict:
    """How far audio decoded window by window, each with the shipped left context, is from one whole
    decode of the same frames: relative L2 error and the largest sample difference."""
    connector = resolve("qwen3_tts").connector()
    codec = build_models(preset, parts=("codec",), device=device, dtype=dtype).codec
    frames = seconds * SAMPLE_RATE // SAMPLES_PER_FRAME
    codes = torch.randint(0, 2048, (1, frames, 16), generator=torch.Generator().manual_seed(1)).to(device)
    whole = codec(codes)[0].float()
    pieces = []
    for start, end in windows(frames, connector.initial_codec_chunk_frames, connector.codec_chunk_frames):
        first = max(0, start - connector.codec_left_context_frames)
        audio = codec(codes[:, first:end], first_position=first)[0].float()
        pieces.append(audio[(start - first) * SAMPLES_PER_FRAME:])
    streamed = torch.cat(pieces)
    return {"preset": preset, "device": device, "dtype": dtype, "seconds": seconds,
            "left_context": connector.codec_left_context_frames, "receptive_field": codec.shape.receptive_field,
            "relative_l2": float((streamed - whole).norm() / whole.norm()),
            "max_abs": float((streamed - whole).abs().max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="0.6b")
    ap.add_argument("--parity", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    cost = codec_cost(args.preset)
    print(f"codec: {cost['codec_gmac_per_audio_s']:.1f} GMAC per audio second, {cost['codec_params_m']:.1f}M parameters")
    if args.parity:
        d = streaming_difference(args.preset, args.device, args.dtype)
        print(f"streamed against whole, {d['seconds']} s, {args.device} {args.dtype}: relative L2 {d['relative_l2']:.2e}, "
              f"largest sample difference {d['max_abs']:.2e} (receptive field {d['receptive_field']} frames, "
              f"left context {d['left_context']})")


if __name__ == "__main__":
    main()
