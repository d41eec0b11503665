"""Rotary position embeddings, plain or YaRN-scaled.

The tables are cos/sin of position x inverse frequency, in the rotate-half layout of OLMo, GPT-NeoX and
transformers. YaRN (Peng et al. 2023; OLMo 3's long-context models) blends two spectra per frequency: the high
frequencies, which turn many times within the original context, keep their value (extrapolation); the low ones,
which do not complete a turn in it, are divided by `factor` (interpolation); a linear ramp between `beta_fast` and
`beta_slow` rotations joins them. It also scales cos and sin by an attention factor (so q.k by its square), which
keeps the softmax's entropy from growing with the longer context.

The arithmetic follows transformers' `_compute_yarn_parameters` operation for operation (the same fp32 products,
in the same order), so the tables are bitwise transformers' and a long sequence's angles agree to the last bit;
OLMo-core's YaRN computes the same values (its ramp is clipped at half the head, transformers' at the whole head:
they differ only when beta_slow's dimension passes half the head, never at OLMo 3's sizes).
"""

from __future__ import annotations

import math

import torch

from olmo_data.config import RopeScalingConfig


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def attention_factor(yarn: RopeScalingConfig) -> float:
    """YaRN's factor on cos and sin: the config's, else from DeepSeek's mscale pair, else 0.1 ln(factor) + 1."""
    if yarn.attention_factor is not None:
        return yarn.attention_factor
    if yarn.mscale and yarn.mscale_all_dim:
        return _mscale(yarn.factor, yarn.mscale) / _mscale(yarn.factor, yarn.mscale_all_dim)
    return _mscale(yarn.factor)


def inverse_frequencies(head_dim: int, theta: float, yarn: RopeScalingConfig | None = None) -> torch.Tensor:
    """(head_dim / 2,) fp32 inverse frequencies, unscaled or YaRN-blended."""
    if yarn is None:
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).to(dtype=torch.float32) / head_dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (yarn.factor * pos_freqs)

    def dim_of(rotations: float) -> float:  # the dimension whose frequency turns `rotations` times in the context
        context = yarn.original_max_position_embeddings
        return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(dim_of(yarn.beta_fast)), 0)
    high: float = min(math.ceil(dim_of(yarn.beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of one step, not a division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the frequency as trained (extrapolation), 0: divided by factor
    return interpolated * (1 - keep) + extrapolated * keep


def rotary_tables(
    head_dim: int, max_len: int, theta: float, yarn: RopeScalingConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (max_len, head_dim) for positions 0..max_len-1; YaRN's scaled by its attention factor."""
    inv_freq = inverse_frequencies(head_dim, theta, yarn)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (T, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, head_dim), rotate-half layout as in OLMo / GPT-NeoX
    scale = 1.0 if yarn is None else attention_factor(yarn)
    return angles.cos() * scale, angles.sin() * scale


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos/sin: (T, D), or (B, 1, T, D) when each row has its own positions."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)
