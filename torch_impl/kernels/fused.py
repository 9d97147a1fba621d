"""``"triton"``: one fused Triton program per block of queries, Shaw's key and value terms inside (KERN-1).

Flash attention with Shaw's two terms (SHAW-1..SHAW-4) in the loop. A
program holds BM queries of one (batch, head) and walks the keys in blocks
of BN with an online softmax (running maximum ``m``, denominator ``l``, the
unnormalised output), all in float32 for 16-bit inputs (PREC-4, one
rounding at the end):

    qr        = s_rel * q @ rel_k.T                (BM, R) once per program: the key term's table logits
    s[i, j]   = s * q_i . k_j + qr[i, idx(j - i)]  idx = clip(j - i, -k, k) + k (SHAW-2, SHAW-3), a gather
    o_i      += p[i, j] v_j                        (SOFTMAX-1)
    S[i, r]  += p[i, j] summed per row r           interior rows: one key each, a gather of p by j = i + r - k;
                                                   rows 0 and 2k: the sums of the keys at -k and beyond, k and beyond
    out_i     = (o_i + S[i] @ rel_v) / l_i          (SHAW-4), a row with no allowed key exactly 0 (MASK-5)

Nothing of shape (Lq, Lk) or (Lq, Lk, d) is written; the allowed keys
(MASK-4: mask, -inf bias, window) are read per block from their broadcast
tensor, the bias input likewise (BIAS-1), and a causal call (CAUSAL-1)
stops at its diagonal block (key blocks past it are never loaded).

Supported: no relative scheme, or Shaw (keys, values, per-head tables;
not its key side), grouped key/value heads, a value head size of its own,
causal rules, masks, bias and windows at default positions (the tables are
indexed by j - i); float32, float16, bfloat16 (and float64 where the
device has float64 dot products; the interpreter has). Not: explicit
positions, the soft cap, mask_fill, a keep mask, weights, gradients (no
backward yet): ``unsupported`` says which.

On a machine without a CUDA device the same program runs through Triton's
interpreter (``TRITON_INTERPRET=1``, set before Triton is imported when
no CUDA device is present), on CPU tensors: slow, exact to the same
arithmetic, so the harness checks the kernel on CPU. The interpreter
computes bfloat16 wrongly (triton-lang/triton#11584), so there bfloat16
calls are refused. Triton needs Python >= 3.11 (the ``triton`` extra).
Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv (HEAD-3); dv (HEAD-4); R = 2k + 1.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from spec._fields import require_int

from .. import _core, schemes
from ._base import Kernel

TRITON_INSTALL = 'pip install -e ".[triton]" (triton 3.9.0, Python >= 3.11)'
BFLOAT16_IN_INTERPRETER = "the Triton interpreter computes bfloat16 wrongly (triton-lang/triton#11584)"


def triton_unavailable() -> Optional[str]:
    """Why Triton cannot run here, or None."""
    if sys.version_info < (3, 11):
        return f"Triton needs Python >= 3.11, this is {sys.version.split()[0]}"
    if importlib.util.find_spec("triton") is None:
        return f"Triton is not installed; {TRITON_INSTALL}"
    return None


def interpreting() -> bool:
    """True when Triton runs its programs through the interpreter (no CUDA device, or TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available()


@dataclass(frozen=True)
class Triton(Kernel):
    """The fused Triton kernel (KERN-1).

    Fields:
      block_m: queries per program (a power of two >= 16).
      block_n: keys per step of its loop (a power of two >= 16).
    """

    name: ClassVar[str] = "triton"
    scheme_hooks: ClassVar[frozenset] = frozenset({"key_term", "value_term"})

    block_m: int = 16
    block_n: int = 16

    def __post_init__(self):
        for field in ("block_m", "block_n"):
            value = require_int("Triton", field, getattr(self, field), 16)
            if value & (value - 1):
                raise ValueError(f"Triton.{field}: expected a power of two >= 16, got {value}")

    def unsupported(self, spec, call) -> Optional[str]:
        scheme = spec.relative
        fused = None
        if scheme is not None:
            hook = getattr(schemes.module_for(scheme), "fused_unsupported", None)
            fused = (
                f"triton fuses schemes whose terms are clipped tables (Shaw); {type(scheme).__name__} has none"
                if hook is None
                else hook(scheme)
            )
        reasons = [
            triton_unavailable(),
            fused or self.missing_hooks(spec),
            None if call.default_positions else "triton indexes its tables by j - i: default positions only (POS-1)",
            None if spec.softcap is None else "triton has no soft cap (SOFTCAP-1)",
            None if spec.mask_fill is None else "triton gives disallowed keys weight 0 only, no mask_fill (MASK-6)",
            None if call.dropout_keep is None else "triton takes no dropout_keep mask (DROP-1)",
            "triton does not return the weights (return_weights=True)" if call.return_weights else None,
            "triton has no backward yet: it runs calls that record no gradient" if call.requires_grad else None,
            BFLOAT16_IN_INTERPRETER if call.dtype == torch.bfloat16 and interpreting() else None,
        ]
        return "; ".join(r for r in reasons if r is not None) or None


@functools.cache
def _program():
    """The Triton program, decorated once per process; through the interpreter when no CUDA device is present."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton

    from . import _fused_program

    return triton, triton.jit(_fused_program.shaw_forward)


#: Triton's names of the element types of the program's pointers.
_TRITON_TYPES = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: Shared memory per block, in bytes, that CUDA lets a kernel use: sm_80 (A100) 163 KiB, sm_90 (H100, H200) 227 KiB.
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 90: 227 * 1024}


def compile_program(arch: int, dtype: torch.dtype, kernel: Triton = Triton(), *, d: int = 64, dv: int = 64,
                    max_distance: int = 16, causal: bool = True, masked: bool = True, keys: bool = True,
                    values: bool = True):  # fmt: skip
    """The program compiled for a CUDA device of compute capability ``arch`` (80, 90) without one: Triton lowers
    it to PTX and its bundled ptxas assembles a cubin on this machine; the result's ``metadata.shared`` is the
    shared memory one program needs (check it against ``SHARED_MEMORY_LIMIT``). Needs a process in which
    Triton is not interpreting (``TRITON_INTERPRET`` unset when Triton is imported)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from . import _fused_program

    names = list(inspect.signature(_fused_program.shaw_forward).parameters)
    constexprs = dict(
        KMAX=max_distance, CAUSAL=causal, MASKED=masked, BIASED=masked, KEYS=keys, VALUES=values, GROUP=1,
        BM=kernel.block_m, BN=kernel.block_n, DP=_pow2(d), DVP=_pow2(dv), RP=_pow2(2 * max_distance + 1),
    )  # fmt: skip
    pointer = f"*{_TRITON_TYPES[dtype]}"
    signature = {
        n: "constexpr" if n in constexprs
        else "*i8" if n == "A"
        else pointer if n in ("Q", "K", "V", "RK", "RV", "BIAS", "OUT")
        else "fp32" if n in ("scale", "rel_scale")
        else "i32"
        for n in names
    }  # fmt: skip
    source = ASTSource(
        JITFunction(_fused_program.shaw_forward), signature, {(names.index(n),): v for n, v in constexprs.items()}
    )
    return triton.compile(source, target=GPUTarget("cuda", arch, 32))


def _pow2(n: int) -> int:
    return max(16, 1 << max(n - 1, 0).bit_length())


def attention(kernel: Triton, spec, params: dict, q, k, v, call: _core.Call) -> torch.Tensor:
    """q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv) -> o (B, H, Lq, dv).

    Implements SCALE-2, SCALE-3, SHAW-1..4, MASK-4, MASK-5, BIAS-1, BIAS-2, CAUSAL-1, WINDOW-1, HEAD-3, HEAD-4,
    SOFTMAX-1, PREC-4.
    """
    triton, program = _program()
    B, H, Lq, d = q.shape
    Hkv, Lk, dv = k.shape[1], k.shape[2], v.shape[3]
    scheme = spec.relative
    rel_k, rel_v, kmax = (None, None, 0) if scheme is None else schemes.module_for(scheme).fused_tables(scheme, params)
    dummy = q.new_zeros(1, 1, 1)
    rk = dummy if rel_k is None else (rel_k if rel_k.dim() == 3 else rel_k.unsqueeze(0)).contiguous()
    rv = dummy if rel_v is None else (rel_v if rel_v.dim() == 3 else rel_v.unsqueeze(0)).contiguous()
    allowed = call.allowed  # the causal rule alone is computed in the program (and stops its loop)
    has_mask = allowed is not None and (call.mask is not None or call.bias is not None or spec.window is not None)
    mask = _core.as_4d(allowed).to(torch.int8).expand(B, H, Lq, Lk) if has_mask else dummy
    bias = _core.as_4d(call.bias).expand(B, H, Lq, Lk) if call.bias is not None else dummy
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = q.new_empty(B, H, Lq, dv)
    strides = lambda t, n: t.stride()[:n] if t is not dummy else (0,) * n  # noqa: E731
    grid = (triton.cdiv(Lq, kernel.block_m), B * H)
    program[grid](
        q, k, v, rk, rv, mask, bias, o,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        rk.stride(0) if rk.shape[0] > 1 else 0, rv.stride(0) if rv.shape[0] > 1 else 0,
        *strides(mask, 4), *strides(bias, 4), *o.stride()[:3],
        H, Lq, Lk, d, dv, 2 * kmax + 1, spec.effective_scale, spec.relative_scale,
        KMAX=kmax, CAUSAL=spec.causal, MASKED=has_mask, BIASED=call.bias is not None,
        KEYS=rel_k is not None, VALUES=rel_v is not None, GROUP=H // Hkv,
        BM=kernel.block_m, BN=kernel.block_n, DP=_pow2(d), DVP=_pow2(dv), RP=_pow2(2 * kmax + 1),
    )  # fmt: skip
    return o
