"""Model shapes.  `tiny` runs the whole matrix on a 2-core CPU; `0.6b` has Qwen3-TTS 0.6B's shapes."""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

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
    """The codec decoder's sizes, laid out as Qwen3-TTS-Tokenizer-12Hz's decoder is: quantizer embeddings,
    a causal conv to the latent width, a sliding-window transformer, ConvNeXt upsampling at the latent
    width, an input conv to `decoder_dim`, then one block per upsampling rate whose channels halve."""
    codebook_dim: int
    latent: int
    hidden: int                      # the transformer's width
    layers: int
    heads: int
    head_dim: int
    window: int                      # sliding-window attention, in frames
    intermediate: int
    decoder_dim: int
    pre_upsample: tuple[int, ...] = (2, 2)
    upsample: tuple[int, ...] = (8, 5, 4, 3)
    dilations: tuple[int, ...] = (1, 3, 9)   # a block's residual units
    kernel: int = 7                          # the convs over time (ConvNeXt, input, residual units, output)

    @property
    def block_channels(self) -> tuple[int, ...]:
        return tuple(self.decoder_dim // 2 ** (i + 1) for i in range(len(self.upsample)))

    @property
    def receptive_field(self) -> int:
        """Frames of left context a frame's first sample depends on.  Each causal conv reaches back
        (kernel - 1) * dilation samples at its own rate; a transposed conv of kernel 2 * rate reaches one
        input sample back; each transformer layer, window - 1 frames."""
        reach, rate = Fraction(2 + self.layers * (self.window - 1)), 1   # the kernel-3 input conv, attention
        for factor in self.pre_upsample:
            rate *= factor
            reach += Fraction(self.kernel - 1, rate)                      # the ConvNeXt block's depthwise conv
        reach += Fraction(self.kernel - 1, rate)                          # the input conv
        for factor in self.upsample:
            reach += Fraction(1, rate)
            rate *= factor
            reach += Fraction((self.kernel - 1) * sum(self.dilations), rate)
        return math.ceil(reach + Fraction(self.kernel - 1, rate))         # the output conv


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
        codec=CodecShape(codebook_dim=32, latent=64, hidden=64, layers=1, heads=2, head_dim=32, window=16,
                         intermediate=128, decoder_dim=32),
    ),
    "0.6b": Preset(
        "0.6b",
        talker=DecoderShape(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
        code_predictor=DecoderShape(hidden=1024, layers=5, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
        # the real decoder's sizes: about 30 GMAC a second of audio (benchmarks/codec_cost.py measures it)
        codec=CodecShape(codebook_dim=512, latent=1024, hidden=512, layers=8, heads=16, head_dim=64, window=72,
                         intermediate=1024, decoder_dim=1536),
    ),
}
