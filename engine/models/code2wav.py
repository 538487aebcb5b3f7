"""Stage 1: the codec decoder, frames [T, 16] -> 24 kHz audio [T * 1920].

Laid out as Qwen3-TTS-Tokenizer-12Hz's decoder: quantizer embeddings, a causal conv
to the latent width, a sliding-window transformer, two ConvNeXt upsampling steps,
an input conv, then four blocks (SnakeBeta, a transposed conv of kernel 2 x rate,
three dilated residual units) and an output conv.  Its cost is the real one's.

Everything is causal with a bounded receptive field (CodecShape.receptive_field
frames).  Where the streaming left context covers it (`tiny`), decoding a window
with its context gives the same samples as decoding the whole sequence; where it
does not (`0.6b`, as in the real engine), chunk edges differ a little, and
benchmarks/gpu_parity.py reports by how much.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models import kernels
from engine.models.kv_cache import CausalView
from engine.models.layers import Decoder
from engine.models.presets import CODEBOOK_SIZE, CODEBOOKS, SAMPLES_PER_FRAME, CodecShape, DecoderShape


class CausalConv(nn.Module):
    """A conv that sees only the present and the past.  The conv pads both ends itself and the outputs
    past the input's end are dropped: the same samples as padding the left end first, without a padded
    copy of the activation (the codec's widest are a hundred megabytes a pass)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups, padding=(kernel - 1) * dilation)

    def forward(self, x):  # [B, C, T]
        return self.conv(x)[..., :x.shape[-1]]


class CausalUpsample(nn.Module):
    """A transposed conv with its right overhang cut: output sample n hears input n // rate and,
    when the kernel is longer than the rate, the inputs before it, never one after."""

    def __init__(self, cin: int, cout: int, rate: int, kernel: int):
        super().__init__()
        self.rate = rate
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=rate)

    def forward(self, x):
        return self.conv(x)[..., :x.shape[-1] * self.rate]


class SnakeBeta(nn.Module):
    """x + sin^2(alpha x) / beta, per channel, alpha and beta kept as logarithms."""

    def __init__(self, channels: int):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.zeros(channels, 1))
        self.log_beta = nn.Parameter(torch.zeros(channels, 1))

    def forward(self, x):
        if kernels.use(x):   # one pass over the activation instead of five
            return kernels.snake(x, self.log_alpha, self.log_beta)
        return x + torch.sin(x * self.log_alpha.exp()).pow(2) / (self.log_beta.exp() + 1e-9)


class ConvNeXt(nn.Module):
    """Depthwise causal conv, LayerNorm, a 4x pointwise MLP with GELU, a learned scale, residual."""

    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, kernel, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1 = nn.Linear(dim, 4 * dim)
        self.pw2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x):  # [B, C, T]
        y = self.norm(self.dwconv(x).transpose(1, 2))
        return x + (self.pw2(F.gelu(self.pw1(y))) * self.gamma).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, kernel: int, dilation: int):
        super().__init__()
        self.act1, self.conv1 = SnakeBeta(dim), CausalConv(dim, dim, kernel, dilation)
        self.act2, self.conv2 = SnakeBeta(dim), nn.Conv1d(dim, dim, 1)

    def forward(self, x):
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int, shape: CodecShape):
        super().__init__()
        self.act = SnakeBeta(cin)
        self.up = CausalUpsample(cin, cout, rate, 2 * rate)
        self.units = nn.Sequential(*(ResidualUnit(cout, shape.kernel, d) for d in shape.dilations))

    def forward(self, x):
        return self.units(self.up(self.act(x)))


class CodecDecoder(nn.Module):
    def __init__(self, shape: CodecShape):
        super().__init__()
        self.shape = shape
        self.embeds = nn.Parameter(torch.empty(CODEBOOKS, CODEBOOK_SIZE, shape.codebook_dim))
        nn.init.normal_(self.embeds, std=0.5)
        self.pre_conv = CausalConv(shape.codebook_dim, shape.latent, 3)
        self.input_proj = nn.Linear(shape.latent, shape.hidden)
        self.transformer = Decoder(DecoderShape(hidden=shape.hidden, layers=shape.layers, heads=shape.heads,
                                                kv_heads=shape.heads, head_dim=shape.head_dim,
                                                intermediate=shape.intermediate, rope_theta=10000.0))
        self.output_proj = nn.Linear(shape.hidden, shape.latent)
        self.pre_upsample = nn.Sequential(*(nn.Sequential(CausalUpsample(shape.latent, shape.latent, f, f),
                                                          ConvNeXt(shape.latent, shape.kernel))
                                            for f in shape.pre_upsample))
        self.input_conv = CausalConv(shape.latent, shape.decoder_dim, shape.kernel)
        channels = (shape.decoder_dim,) + shape.block_channels
        self.blocks = nn.Sequential(*(DecoderBlock(channels[i], channels[i + 1], rate, shape)
                                      for i, rate in enumerate(shape.upsample)))
        self.out_act = SnakeBeta(channels[-1])
        self.out = CausalConv(channels[-1], 1, shape.kernel)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor, first_position: int | torch.Tensor = 0) -> torch.Tensor:
        """codes [B, T, 16] -> audio [B, T * 1920]; row b's positions start at first_position (one int, or
        one per row: rotary is relative).  Everything is causal, so frames padded on after a row's end
        change none of its samples."""
        b, t, _ = codes.shape
        if isinstance(first_position, torch.Tensor):
            first_position = first_position.to(codes.device)[:, None]
        x = self.embeds[torch.arange(CODEBOOKS, device=codes.device), codes].sum(2)   # [B, T, codebook_dim]
        x = self.pre_conv(x.to(self.input_proj.weight.dtype).transpose(1, 2)).transpose(1, 2)
        positions = (torch.arange(t, device=codes.device) + first_position).expand(b, t)
        x = self.input_proj(x)
        x = self.output_proj(self.transformer(x, positions, CausalView(positions, self.shape.window)))
        x = self.input_conv(self.pre_upsample(x.transpose(1, 2)))
        audio = torch.tanh(self.out(self.out_act(self.blocks(x)))[:, 0])
        assert audio.shape[1] == t * SAMPLES_PER_FRAME
        return audio
