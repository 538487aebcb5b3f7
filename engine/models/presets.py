"""Model shapes.  `tiny` runs the whole matrix on a 2-core CPU; `0.6b` has Qwen3-TTS 0.6B's shapes."""
from __future__ import annotations

from dataclasses import dataclass

CODEBOOKS = 16
CODEBOOK_SIZE = 2048
CODEC_VOCAB = 3072          # codebook-0 ids; 2048..3071 are special
CODEC_BOS, CODEC_EOS = 2149, 2150   # 2148 is the (unused) codec pad
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920    # 2*2 (pre-upsample) * 8*5*4*3: 12.5 frames a second


@dataclass(frozen=True)
class DecoderShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 1e6


@dataclass(frozen=True)
class CodecShape:
    hidden: int
    layers: int
    heads: int
    window: int                      # sliding-window attention, in frames
    intermediate: int
    pre_upsample: tuple[int, ...] = (2, 2)
    upsample: tuple[int, ...] = (8, 5, 4, 3)
    upsample_channels: tuple[int, ...] = (32, 16, 8, 8)

    @property
    def receptive_field(self) -> int:
        """Frames of left context a frame's audio depends on (causal convs + windowed attention)."""
        return 2 + self.layers * (self.window - 1) + len(self.upsample) + len(self.pre_upsample)


@dataclass(frozen=True)
class Preset:
    name: str
    talker: DecoderShape
    code_predictor: DecoderShape
    codec: CodecShape


PRESETS = {
    "tiny": Preset(
        "tiny",
        talker=DecoderShape(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=384),
        code_predictor=DecoderShape(hidden=128, layers=1, heads=4, kv_heads=2, head_dim=32, intermediate=256),
        codec=CodecShape(hidden=64, layers=1, heads=2, window=16, intermediate=128),
    ),
    "0.6b": Preset(
        "0.6b",
        talker=DecoderShape(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
        code_predictor=DecoderShape(hidden=1024, layers=5, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
        codec=CodecShape(hidden=512, layers=8, heads=8, window=8, intermediate=1024,
                         upsample_channels=(256, 128, 64, 32)),
    ),
}
