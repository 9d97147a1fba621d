"""Rotary position embedding in PyTorch: a q/k transform (ROPE-1..ROPE-9).

Each head's first r channels form r/2 pairs (ROPE-2), ``(c, c + r/2)`` in
the half layout or ``(2c, 2c + 1)`` in the interleaved one (ROPE-3). Pair c
of a vector at position p turns by the angle ``a = p * f_c`` (ROPE-4,
ROPE-5) and both of its channels are multiplied by the attention factor af
(ROPE-7):

    (x, y) -> af * (x cos a - y sin a,  x sin a + y cos a)

Channels r .. d - 1 pass unchanged and unscaled; v is never rotated. The
angles are float64 products of the exact integer positions and the float64
frequencies (ROPE-9); af * cos and af * sin are then cast to the dtype of
the rotation: the input dtype, or float32 for float16 and bfloat16, whose
rotated q and k are rounded to the input dtype once (PREC-4). The tables
are (1|B, 1, L, r/2); the rotation is elementwise on (B, H|Hkv, L, d):
nothing of shape (Lq, Lk, d), no loop over positions. It is one autograd
node (``Rotation``) whose backward is the rotation by the negated angles,
written into one output tensor per call (``turn``).

One hook, ``qk_transform``; every kernel calls it once per call, after the
head split and before any logit (REL-3 (1)). Axis legend (AXES-1): B, H,
Lq, Lk, d; Hkv key/value heads (HEAD-3).
"""

from __future__ import annotations

import torch

from .._core import stat_dtype


def angle_tables(scheme, positions: torch.Tensor, head_dim: int, dtype: torch.dtype):
    """ROPE-4, ROPE-7, ROPE-9: (af * cos(a), af * sin(a)) in ``dtype``, a = p * f_c in float64.

    positions (1|B, L) int64 -> two (1|B, 1, L, r/2) tensors on the positions' device.
    """
    freq = torch.tensor(scheme.frequencies(head_dim), dtype=torch.float64, device=positions.device)  # (r/2,)
    angle = positions.to(torch.float64)[:, None, :, None] * freq  # (1|B, 1, L, r/2), exact p times f_c
    cos, sin = torch.cos(angle), torch.sin(angle)
    af = scheme.attention_factor
    if af != 1.0:  # ROPE-7 (a factor of 1 is exact: skipped)
        cos, sin = af * cos, af * sin
    return cos.to(dtype), sin.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, layout: str) -> torch.Tensor:
    """ROPE-3, ROPE-5: x (B, H, L, d) with its r rotated channels turned pair by pair; the rest unchanged.

    cos, sin (1|B, 1, L, r/2) carry the attention factor (ROPE-7) and fix the
    dtype of the arithmetic; the result is rounded to x's dtype once (PREC-4).
    Differentiable: one autograd node whose backward is the rotation by the
    negated angles (``Rotation``).
    """
    return Rotation.apply(x, cos, sin, rotary_dim, layout)


class Rotation(torch.autograd.Function):
    """ROPE-5 as one autograd node. The rotation is linear in x and each pair's 2x2 block af * R(a) has
    the transpose af * R(-a), so the VJP is the same rotation with sin negated (GRAD-1; numpy_ref's
    ``qk_transform_vjp`` is the same formula). Its backward applies ``Rotation`` again, so it is
    differentiable in turn."""

    @staticmethod
    def forward(ctx, x, cos, sin, rotary_dim: int, layout: str):
        ctx.save_for_backward(cos, sin)
        ctx.rotary_dim, ctx.layout = rotary_dim, layout
        return turn(x, cos, sin, rotary_dim, layout)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return Rotation.apply(grad, cos, -sin, ctx.rotary_dim, ctx.layout), None, None, None, None


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, layout: str) -> torch.Tensor:
    """The arithmetic of ``rotate``, written into one new (B, H, L, d) tensor of x's dtype (no autograd): the
    pairs of ROPE-3 turned as ROPE-5 says, channels r .. d - 1 copied (ROPE-2); ``Rotation``'s backward
    (GRAD-1) is this arithmetic too, with the angles negated.

    Per pair (a, b) of the rotated channels: first = a cos - b sin, second = a
    sin + b cos, each a multiply into the output and one fused multiply-add:
    no temporaries of the size of x (fresh memory for each of them costs more
    than the arithmetic on a CPU: at B = 2, H = 8, L = 1024, d = 64 on one
    thread 1.2 ms per tensor, against 5.0 ms for the same formula written with
    temporaries and a ``cat``). Interleaved pairs whose strides allow it are
    one complex multiply. In float16/bfloat16 the pairs are turned in float32
    and the result rounded to x's dtype once (PREC-4).
    """
    r, half = rotary_dim, rotary_dim // 2
    src = x[..., :r].to(cos.dtype)  # x itself (a view) unless the rotation runs in float32 (PREC-4)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    same = cos.dtype == x.dtype
    dst = out[..., :r] if same else torch.empty(src.shape, dtype=cos.dtype, device=x.device)
    if layout == "interleaved" and _complex_view(src) and _complex_view(dst):
        # pairs (2c, 2c + 1) are the real and imaginary parts of one complex number: one complex multiply
        torch.mul(
            torch.view_as_complex(src.unflatten(-1, (half, 2))),
            torch.complex(cos, sin),
            out=torch.view_as_complex(dst.unflatten(-1, (half, 2))),
        )
    else:
        if layout == "half":  # pairs (c, c + r/2)
            a, b, first, second = src[..., :half], src[..., half:], dst[..., :half], dst[..., half:]
        else:  # "interleaved" with strides a complex view cannot take: pairs (2c, 2c + 1)
            a, b, first, second = src[..., 0::2], src[..., 1::2], dst[..., 0::2], dst[..., 1::2]
        torch.mul(a, cos, out=first).addcmul_(b, sin, value=-1.0)
        torch.mul(a, sin, out=second).addcmul_(b, cos)
    if not same:
        out[..., :r].copy_(dst)  # the one rounding to x's dtype (PREC-4)
    if r < x.shape[-1]:
        out[..., r:].copy_(x[..., r:])  # ROPE-2: channels r .. d - 1 pass unchanged
    return out


def qk_transform(scheme, params: dict, q: torch.Tensor, k: torch.Tensor, q_positions, k_positions):
    """ROPE-5: q (B, H, Lq, d) at q_positions (1|B, Lq) and k (B, Hkv, Lk, d) at k_positions (1|B, Lk),
    each rotated -> (q, k) of the same shapes and dtypes. No tables (ROPE-1): ``params`` is not read."""
    d = q.shape[-1]
    r, compute = scheme.rotated(d), stat_dtype(q.dtype)  # PREC-4: float32 for the 16-bit dtypes
    cos_q, sin_q = angle_tables(scheme, q_positions, d, compute)
    if k_positions is q_positions:  # one table for both (the default positions of self-attention)
        cos_k, sin_k = cos_q, sin_q
    else:
        cos_k, sin_k = angle_tables(scheme, k_positions, d, compute)
    return rotate(q, cos_q, sin_q, r, scheme.layout), rotate(k, cos_k, sin_k, r, scheme.layout)


def _complex_view(t: torch.Tensor) -> bool:
    """Whether ``torch.view_as_complex`` takes the (..., r/2, 2) view of t: float32/float64, unit stride in
    the channels, every other stride and the offset even."""
    return (
        t.dtype in (torch.float32, torch.float64)
        and t.stride(-1) == 1
        and t.storage_offset() % 2 == 0
        and all(st % 2 == 0 for st in t.stride()[:-1])
    )
