"""``pallas``: one fused Pallas program per block of queries, Shaw's key and value terms inside (KERN-1).

The algorithm of torch_impl's ``"triton"`` kernel, written in Pallas: a
program holds ``block_q`` queries of one (batch, head) and walks the keys in
blocks of ``block_k`` with an online softmax (running maximum, denominator,
unnormalised output; float32 for 16-bit inputs, PREC-4). Shaw's key term is
the block's table logits ``s_rel * q @ rel_k.T`` (block_q, R) read at each
pair's row, its value term the weights summed per row, ``@ rel_v`` at the
end (SHAW-2..SHAW-4). Rows are selected by comparison with the row index,
not gathered, so the program lowers to Triton (which Pallas rejects gathers
and static slices for). A causal call stops at its diagonal block; the mask,
-inf bias entries and the window come as the allowed-key array (MASK-4),
the bias input as an array (BIAS-1), each cut per block. A row with no
allowed key gives exactly 0 (MASK-5).

Supported: no relative scheme, or Shaw (keys, values, per-head tables; not
its key side), grouped key/value heads, a value head size of its own, at
default positions; every dtype. Not: explicit positions, the soft cap,
mask_fill, a keep mask, weights. ``pallas_call`` has no derivative rule, so
the kernel is a ``jax.custom_vjp``: the fused program forward, and as its
backward the VJP of the ``"tiles"`` kernel on the same inputs (which
recomputes the forward in tiles: gradients of every input and table, no
fused backward program yet).

Where the default backend is the CPU the program runs in Pallas's interpret
mode (``interpret=True``: the same program as jnp operations), so the
harness checks it on CPU; on GPU it lowers to Triton
(``jax.experimental.pallas.triton.CompilerParams``).
Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv (HEAD-3); dv (HEAD-4); R = 2k + 1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp

from spec import AttentionSpec

from .. import schemes
from ..masking import stat_dtype
from ._base import Call, Inputs, Kernel
from .tiles import Tiles


@dataclass(frozen=True)
class Pallas(Kernel):
    """The fused Pallas kernel (KERN-1).

    Fields:
      block_q: queries per program (a power of two >= 16, the smallest block Triton's dot takes; with
        ``interpret=True`` any power of two: the interpreter has no such floor).
      block_k: keys per step of its loop (likewise).
      interpret: run the program in Pallas's interpret mode; None: where the default backend is the CPU.
    """

    name: ClassVar[str] = "pallas"
    block_q: int = 16
    block_k: int = 16
    interpret: Optional[bool] = None

    def __post_init__(self):
        if self.interpret is not None and not isinstance(self.interpret, bool):
            raise TypeError(f"Pallas.interpret: expected None or a bool, got {self.interpret!r}")
        least = 1 if self.interpret is True else 16
        for field in ("block_q", "block_k"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < least or value & (value - 1):
                floor = "" if least == 1 else f" >= {least}"
                raise ValueError(f"Pallas.{field}: expected a power of two{floor}, got {value!r}")

    def unsupported(self, spec: AttentionSpec, call: Call) -> Optional[str]:
        scheme = spec.relative
        fused = None
        if scheme is not None:
            hook = getattr(schemes.module_for(scheme), "fused_unsupported", None)
            fused = (
                f"pallas fuses schemes whose terms are clipped tables (Shaw); {type(scheme).__name__} has none"
                if hook is None
                else hook(scheme)
            )
        reasons = [
            fused,
            None if call.default_positions else "pallas indexes its tables by j - i: default positions only (POS-1)",
            None if spec.softcap is None else "pallas has no soft cap (SOFTCAP-1)",
            None if spec.mask_fill is None else "pallas gives disallowed keys weight 0 only, no mask_fill (MASK-6)",
            "pallas takes no dropout_keep mask (DROP-1)" if call.dropout_keep else None,
            "pallas does not return the weights (return_weights=True)" if call.return_weights else None,
        ]
        return "; ".join(r for r in reasons if r is not None) or None

    def __call__(self, spec: AttentionSpec, params: dict, x: Inputs, call: Call):
        """(o (B, H, Lq, dv) in the query's dtype, None). Implements SCALE-2, SCALE-3, SHAW-1..4, MASK-4, MASK-5,
        BIAS-1, BIAS-2, CAUSAL-1, WINDOW-1, HEAD-3, HEAD-4, SOFTMAX-1, PREC-4."""
        scheme = spec.relative
        masked = call.mask or call.bias or spec.window is not None  # else the causal rule alone, in the program
        interpret = jax.default_backend() == "cpu" if self.interpret is None else self.interpret

        def fused(params, x):
            rel_k, rel_v, kmax = (
                (None, None, 0) if scheme is None else schemes.module_for(scheme).fused_tables(scheme, params)
            )
            return fused_attention(
                x.q, x.k, x.v, rel_k, rel_v, x.allowed if masked else None, x.bias,
                kmax=kmax, scale=spec.effective_scale, rel_scale=spec.relative_scale, causal=spec.causal,
                block_q=self.block_q, block_k=self.block_k, interpret=interpret,
            )  # fmt: skip

        def tiled(params, x):  # GRAD-1: the same function, differentiable by JAX
            return Tiles()(spec, params, x, call)[0]

        attention = jax.custom_vjp(fused)
        attention.defvjp(lambda p, x: (fused(p, x), (p, x)), lambda saved, g: jax.vjp(tiled, *saved)[1](g))
        return attention(params, x), None


def _pow2(n: int) -> int:
    return max(16, 1 << max(n - 1, 0).bit_length())


def _pad(x, axis: int, size: int):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def fused_attention(q, k, v, rel_k, rel_v, allowed, bias, *, kmax: int, scale: float, rel_scale: float,
                    causal: bool, block_q: int = 16, block_k: int = 16, interpret: bool = True):  # fmt: skip
    """q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv), tables (R, c) | (H, R, c) or None, ``allowed``
    bool and ``bias`` broadcastable to (B, H, Lq, Lk) or None -> o (B, H, Lq, dv) in q's dtype, at default
    positions. Every axis is padded to the block sizes (rows, keys) or powers of two (channels, rows of the
    tables) and masked inside."""
    from jax.experimental import pallas as pl

    B, H, Lq, d = q.shape
    Hkv, Lk, dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hkv
    R = 2 * kmax + 1
    dP, dvP, RP = _pow2(d), _pow2(dv), _pow2(R)
    LqP, LkP = -(-Lq // block_q) * block_q, -(-Lk // block_k) * block_k
    qP, kP, vP = _pad(_pad(q, 2, LqP), 3, dP), _pad(_pad(k, 2, LkP), 3, dP), _pad(_pad(v, 2, LkP), 3, dvP)

    def table(t, cols):
        if t is None:
            return jnp.zeros((1, RP, cols), q.dtype)
        return _pad(_pad(t if t.ndim == 3 else t[None], 1, RP), 2, cols)

    def per_pair(a, dtype):
        if a is None:
            return jnp.zeros((1, 1, block_q, LkP), dtype)
        return _pad(_pad(jnp.broadcast_to(a, (B, H, Lq, Lk)).astype(dtype), 2, LqP), 3, LkP)

    rk, rv = table(rel_k, dP), table(rel_v, dvP)
    a, bb = per_pair(allowed, jnp.int8), per_pair(bias, q.dtype)
    rows_of = lambda per_head: (lambda bh, i: (bh % H, 0, 0)) if per_head else (lambda bh, i: (0, 0, 0))  # noqa: E731
    pairs_of = lambda present: (lambda bh, i: (bh // H, bh % H, i, 0)) if present else (lambda bh, i: (0, 0, 0, 0))  # noqa: E731
    kv = lambda bh, i: (bh // H, (bh % H) // G, 0, 0)  # noqa: E731  HEAD-3
    body = functools.partial(
        _program, Lq=Lq, Lk=Lk, kmax=kmax, scale=scale, rel_scale=rel_scale, causal=causal,
        masked=allowed is not None, biased=bias is not None, keys=rel_k is not None, values=rel_v is not None,
        BQ=block_q, BK=block_k, nk=LkP // block_k, stat=stat_dtype(q.dtype),
    )  # fmt: skip
    params = None
    if not interpret:
        from jax.experimental.pallas import triton as plgpu

        params = plgpu.CompilerParams(num_warps=4, num_stages=2)
    out = pl.pallas_call(
        body,
        grid=(B * H, LqP // block_q),
        in_specs=[
            pl.BlockSpec((None, None, block_q, dP), lambda bh, i: (bh // H, bh % H, i, 0)),
            pl.BlockSpec((None, None, LkP, dP), kv),
            pl.BlockSpec((None, None, LkP, dvP), kv),
            pl.BlockSpec((None, RP, dP), rows_of(rk.shape[0] > 1)),
            pl.BlockSpec((None, RP, dvP), rows_of(rv.shape[0] > 1)),
            pl.BlockSpec((None, None, block_q, LkP), pairs_of(allowed is not None)),
            pl.BlockSpec((None, None, block_q, LkP), pairs_of(bias is not None)),
        ],
        out_specs=pl.BlockSpec((None, None, block_q, dvP), lambda bh, i: (bh // H, bh % H, i, 0)),
        out_shape=jax.ShapeDtypeStruct((B, H, LqP, dvP), q.dtype),
        interpret=interpret,
        compiler_params=params,
    )(qP, kP, vP, rk, rv, a, bb)
    return out[:, :, :Lq, :dv]


def _program(q_ref, k_ref, v_ref, rk_ref, rv_ref, a_ref, b_ref, o_ref, *, Lq, Lk, kmax, scale, rel_scale, causal,
             masked, biased, keys, values, BQ, BK, nk, stat):  # fmt: skip
    """One program: the queries i * BQ .. of one (batch, head) against every key block in turn."""
    from jax.experimental import pallas as pl

    i = pl.program_id(1)
    q = q_ref[...].astype(stat)  # (BQ, dP)
    rows_i = i * BQ + jnp.arange(BQ)
    r_index = jnp.arange(rk_ref.shape[0])  # (RP,)
    qr = jnp.dot(q, rk_ref[...].astype(stat).T) * rel_scale if keys else None  # SHAW-3, SCALE-3: (BQ, RP)

    def step(n, carry):
        m, denom, acc, rows = carry
        start = n * BK
        kb = k_ref[pl.ds(start, BK), :].astype(stat)
        vb = v_ref[pl.ds(start, BK), :]
        s = jnp.dot(q, kb.T) * scale  # SCALE-2
        cols = start + jnp.arange(BK)
        delta = cols[None, :] - rows_i[:, None]  # POS-2 at default positions
        hit = (jnp.clip(delta, -kmax, kmax) + kmax)[:, :, None] == r_index  # SHAW-2: (BQ, BK, RP), no gather
        if keys:
            s = s + jnp.sum(jnp.where(hit, qr[:, None, :], 0.0), axis=-1)
        ok = (cols[None, :] < Lk) & (rows_i[:, None] < Lq)
        if biased:  # BIAS-1
            s = s + b_ref[:, pl.ds(start, BK)].astype(stat)
        if causal:  # CAUSAL-1
            ok = ok & (delta <= 0)
        if masked:  # MASK-4
            ok = ok & (a_ref[:, pl.ds(start, BK)] != 0)
        s = jnp.where(ok, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row with no allowed key yet
        alpha = jnp.exp(m - m_safe)
        p = jnp.exp(s - m_safe[:, None])
        denom = denom * alpha + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + jnp.dot(p.astype(vb.dtype), vb).astype(stat)
        if values:  # SHAW-4: the weights summed per table row
            rows = rows * alpha[:, None] + jnp.sum(jnp.where(hit, p[:, :, None], 0.0), axis=1)
        return m_new, denom, acc, rows

    init = (
        jnp.full((BQ,), -jnp.inf, stat),
        jnp.zeros((BQ,), stat),
        jnp.zeros((BQ, v_ref.shape[-1]), stat),
        jnp.zeros((BQ, rk_ref.shape[0]), stat),
    )
    stop = jnp.minimum(nk, ((i + 1) * BQ + BK - 1) // BK) if causal else nk  # no key after the block's last query
    _, denom, acc, rows = jax.lax.fori_loop(0, stop, step, init)
    l_safe = jnp.where(denom == 0, 1.0, denom)  # MASK-5: acc and rows are 0 there
    out = acc / l_safe[:, None]
    if values:
        out = out + jnp.dot(rows / l_safe[:, None], rv_ref[...].astype(stat))
    o_ref[...] = out.astype(o_ref.dtype)
