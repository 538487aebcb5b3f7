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


def channels_last_(weight: torch.Tensor) -> None:
    """Keep a conv weight [out, in, k] in memory as [out, k, in] (its shape, values and state-dict entry
    unchanged), so that as [out, in, 1, k] it is channels-last as it stands and cuDNN reads it in place."""
    weight.data = weight.data.transpose(1, 2).contiguous().transpose(1, 2)


def _nchw(x: torch.Tensor) -> torch.Tensor:
    """Time-major [B, T, C] as the [B, C, 1, T] a 2-d conv takes: channels last, the same memory."""
    return x.transpose(1, 2).unsqueeze(2)


def _time_major(y: torch.Tensor) -> torch.Tensor:
    return y.squeeze(2).transpose(1, 2)


class CausalConv(nn.Module):
    """A conv that sees only the present and the past, over time-major [B, rows(T), C] whose first `pad`
    rows are zeros -> [B, T, C_out] (longer where `rows` rounded up: crop it).  The activation before it
    writes those zeros as it writes its output (SnakeBeta's `pad` and `rows`), so no padded copy is
    made; `padded` makes one where nothing does.

    A dilated conv runs as an undilated one over the input folded into `dilation` interleaved columns
    ([B, rows / d, d, C], the same memory): for some dilated shapes cuDNN picks a kernel hundreds of
    times slower than its best (260 ms instead of 0.3 on an H100 for 4 windows of 384 channels at
    dilation 9, with its algorithm timing off or at its default of 10 candidates), and the folded conv
    is faster than its best.  Grouped convs are not folded: folded, they come out wrong on the CPU
    (torch 2.13)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.pad = (kernel - 1) * dilation
        self.fold = dilation if groups == 1 else 1
        channels_last_(self.conv.weight)

    def rows(self, t: int) -> int:
        """Input rows for t outputs: the pad, then t rounded up to a whole number of folds."""
        return self.pad + -(-t // self.fold) * self.fold

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, 0, self.pad, self.rows(x.shape[1]) - self.pad - x.shape[1]))

    def forward(self, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        conv, (b, rows, c), d = self.conv, x.shape, self.fold
        bias = conv.bias if bias else None
        if d == 1:
            return _time_major(F.conv2d(_nchw(x), conv.weight.unsqueeze(2), bias, dilation=(1, conv.dilation[0]),
                                        groups=conv.groups))
        folded = x.view(b, rows // d, d, c).permute(0, 3, 1, 2)   # [B, C, rows / d, d], channels last
        y = F.conv2d(folded, conv.weight.unsqueeze(3), bias)
        return y.permute(0, 2, 3, 1).reshape(b, -1, y.shape[1])


class CausalUpsample(nn.Module):
    """A transposed conv with its right overhang cut: output sample n hears input n // rate and,
    when the kernel is longer than the rate, the inputs before it, never one after.  Time-major in
    and out; the output is a view that leaves the overhang out."""

    def __init__(self, cin: int, cout: int, rate: int, kernel: int):
        super().__init__()
        self.rate = rate
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=rate)
        channels_last_(self.conv.weight)

    def forward(self, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        y = F.conv_transpose2d(_nchw(x.contiguous()), self.conv.weight.unsqueeze(2),
                               self.conv.bias if bias else None, stride=(1, self.rate))
        return _time_major(y)[:, :x.shape[1] * self.rate]


class SnakeBeta(nn.Module):
    """x + sin^2(alpha x) / beta, per channel, alpha and beta kept as logarithms.  Takes time-major
    x [B, T, C] and the bias the product before it left out, and returns [B, rows, C] (pad + T unless
    longer), zeros around x's rows: the input of a causal conv reaching `pad` samples back."""

    def __init__(self, channels: int):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.zeros(channels, 1))
        self.log_beta = nn.Parameter(torch.zeros(channels, 1))

    def forward(self, x, bias=None, pad: int = 0, rows: int | None = None):
        if kernels.use(x):   # one pass, written where the conv reads it
            return kernels.snake(x, self.log_alpha, self.log_beta, bias, pad, rows)
        if bias is not None:
            x = x + bias
        y = x + torch.sin(x * self.log_alpha.exp()[:, 0]).pow(2) / (self.log_beta.exp()[:, 0] + 1e-9)
        after = 0 if rows is None else rows - pad - x.shape[1]
        return F.pad(y, (0, 0, pad, after)) if pad or after else y


class ConvNeXt(nn.Module):
    """Depthwise causal conv, LayerNorm, a 4x pointwise MLP with GELU, a learned scale, residual."""

    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, kernel, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1 = nn.Linear(dim, 4 * dim)
        self.pw2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x):  # [B, T, C]
        y = self.norm(self.dwconv(self.dwconv.padded(x)))
        return x + self.pw2(F.gelu(self.pw1(y))) * self.gamma


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, kernel: int, dilation: int):
        super().__init__()
        self.act1, self.conv1 = SnakeBeta(dim), CausalConv(dim, dim, kernel, dilation)
        self.act2, self.conv2 = SnakeBeta(dim), nn.Conv1d(dim, dim, 1)

    def forward(self, x, bias=None):
        """x [B, T, C] (+ bias, which the upsample before the first unit leaves out) + conv2(act2(conv1(
        act1(x)))).  conv1's bias is added where act2 reads its output."""
        t, conv1 = x.shape[1], self.conv1
        h = conv1(self.act1(x, bias, conv1.pad, conv1.rows(t)), bias=False)[:, :t]
        z = self.act2(h, conv1.conv.bias)
        if kernels.use(z):
            return kernels.pointwise_residual(z, self.conv2.weight, self.conv2.bias, x, bias)
        out = F.linear(z, self.conv2.weight[:, :, 0], self.conv2.bias) + x
        return out + bias if bias is not None else out


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int, shape: CodecShape):
        super().__init__()
        self.act = SnakeBeta(cin)
        self.up = CausalUpsample(cin, cout, rate, 2 * rate)
        self.units = nn.ModuleList(ResidualUnit(cout, shape.kernel, d) for d in shape.dilations)

    def forward(self, x):
        x, bias = self.up(self.act(x), bias=False), self.up.conv.bias   # the first unit adds the bias
        for unit in self.units:
            x, bias = unit(x, bias), None
        return x


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
        x = self.pre_conv(self.pre_conv.padded(x.to(self.input_proj.weight.dtype)))
        positions = (torch.arange(t, device=codes.device) + first_position).expand(b, t)
        x = self.input_proj(x)
        x = self.output_proj(self.transformer(x, positions, CausalView(positions, self.shape.window)))
        x = self.pre_upsample(x)   # time-major [B, T, C] from here to the audio
        x = self.blocks(self.input_conv(self.input_conv.padded(x)))
        audio = torch.tanh(self.out(self.out_act(x, pad=self.out.pad))[..., 0])
        assert audio.shape[1] == t * SAMPLES_PER_FRAME
        return audio
