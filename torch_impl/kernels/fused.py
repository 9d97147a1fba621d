"""``"triton"``: fused Triton programs, Shaw's key and value terms and distance biases inside (KERN-1).

Flash attention with the relative terms in the loop. The forward program
holds BM queries of one (batch, head) and walks the keys in blocks of BN
with an online softmax (running maximum ``m``, denominator ``l``, the
unnormalised output), all in float32 for 16-bit inputs (PREC-4, one
rounding at the end):

    qr        = s_rel * q @ rel_k.T                (BM, R) once per program: the key term's table logits
    s[i, j]   = s * q_i . k_j + qr[i, idx(delta)]  idx = clip(delta, -k, k) + k (SHAW-2, SHAW-3), a gather
              + db[h, delta] + bias[i, j]          a scheme bias of delta alone (ALiBi, T5), the bias input
    o_i      += p[i, j] v_j                        (SOFTMAX-1)
    S[i, r]  += p[i, j] summed per row r           interior rows: one key each, a gather of p by j;
                                                   rows 0 and 2k: the sums of the keys at -k and beyond, k and beyond
    out_i     = (o_i + S[i] @ rel_v) / l_i          (SHAW-4), a row with no allowed key exactly 0 (MASK-5)

and writes each row's maximum logit and 1 / denominator (and, for 16-bit
inputs that need a gradient, the output in float32). The backward recomputes
the weights from them exactly as the forward made them (a log-sum-exp would
be rounded at the logits' magnitude: at logits of 1000 in float32, 3e-5 of
every weight): one program per query block gives dq, the tables' gradients of its
queries (the per-row sums of ``ds`` and of ``p``, times q and dout; written
per program and summed after, no atomics) and the distance bias's gradient
(each block's ``ds`` summed along its diagonals, added atomically at their
distances); one program per key block and key/value head gives dk and dv,
its G query heads in turn (HEAD-3). The softmax's backward uses
``sum_j p dP = dout . out``, the value term included.

delta = j - i + off: positions that are runs of consecutive integers
(default positions, or a KV cache's ``q_positions = arange(Lq) + Lk - Lq``)
are each batch's first query and key positions q0, k0, off = k0 - q0
(POS-1, POS-2). Nothing of shape (Lq, Lk) or
(Lq, Lk, d) is written; the allowed keys (MASK-4: mask, -inf bias, window)
are read per block from their broadcast tensor, the bias input likewise
(BIAS-1), and a causal call (CAUSAL-1) stops at its diagonal block (key
blocks past it are never loaded, nor query blocks before it).

Supported: no relative scheme, RoPE (its rotation of q and k runs first,
REL-3 (1)), Shaw (keys, values, per-head tables; not its key side), Huang
(its tables with a zero row at each end, read by the same clipped index:
every distance past the table reads zero, HUANG-3), ALiBi and T5 (the bias
of each distance, (H, Lq + Lk - 1), built once by the scheme's hook, its
gradient flowing back to T5's table), Swin (each pair's row computed in the
program from both positions, SWIN-3, SWIN-4, POS-5; the table's gradient
added atomically at the rows); grouped key/value heads, a value head size of
its own, causal rules, masks, bias and windows; gradients of q, k, v, the
tables and the bias input; float32, float16, bfloat16 (and float64 where the
device has float64 dot products; the interpreter has). Not: Shaw's key side,
tables of more rows than MAX_TABLE_ROWS holds (255; 63 in float64), positions that are not consecutive
runs, the soft cap, mask_fill, a keep mask, weights: ``unsupported`` says
which. Every product is IEEE (no TF32).

On a machine without a CUDA device the same programs run through Triton's
interpreter (``TRITON_INTERPRET=1``, set before Triton is imported when
no CUDA device is present), on CPU tensors: slow, exact to the same
arithmetic, so the harness checks the kernel on CPU. The interpreter
computes bfloat16 wrongly (triton-lang/triton#11584), so there bfloat16
calls are refused. Triton needs Python >= 3.11 (the ``triton`` extra).
Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv, G (HEAD-3); dv (HEAD-4); R = 2k + 1.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

import torch

from spec._fields import require_int

from .. import _core, schemes
from ._base import Kernel, transform_qk

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
      block_m: queries per program (a power of two >= 16); None: ``blocks`` decides.
      block_n: keys per step of its loop (a power of two >= 16); None: ``blocks`` decides.
    """

    name: ClassVar[str] = "triton"
    scheme_hooks: ClassVar[frozenset] = frozenset({"qk_transform", "key_term", "value_term", "bias"})

    block_m: Optional[int] = None
    block_n: Optional[int] = None

    def __post_init__(self):
        for field in ("block_m", "block_n"):
            if getattr(self, field) is None:
                continue
            value = require_int("Triton", field, getattr(self, field), 16)
            if value & (value - 1):
                raise ValueError(f"Triton.{field}: expected a power of two >= 16, got {value}")

    def blocks(self, dtype: torch.dtype) -> tuple:
        """(block_m, block_n) of a call in ``dtype``: the fields where given; else 64 x 64 for 16-bit inputs and in
        the interpreter (whose cost is per operation, not per element: at L = 130, 16 x 16 blocks take 6x as
        long), and 32 x 32 on a device for float32 and float64 (their programs' shared memory then fits an
        A100's 163 KiB: ``compile_program``)."""
        default = 64 if interpreting() or dtype in (torch.float16, torch.bfloat16) else 32
        return self.block_m or default, self.block_n or default

    def unsupported(self, spec, call) -> Optional[str]:
        reasons = [
            triton_unavailable(),
            scheme_unsupported(spec.relative)
            or self.missing_hooks(spec)
            or table_rows_unsupported(spec.relative, call.dtype),
            positions_unsupported(call),
            None if spec.softcap is None else "triton has no soft cap (SOFTCAP-1)",
            None if spec.mask_fill is None else "triton gives disallowed keys weight 0 only, no mask_fill (MASK-6)",
            None if call.dropout_keep is None else "triton takes no dropout_keep mask (DROP-1)",
            "triton does not return the weights (return_weights=True)" if call.return_weights else None,
            BFLOAT16_IN_INTERPRETER if call.dtype == torch.bfloat16 and interpreting() else None,
            None
            if interpreting() or call.device.type == "cuda"
            else f"Triton compiles for CUDA devices, the tensors are on {call.device} (TRITON_INTERPRET=1 runs its "
            "interpreter)",
        ]
        return "; ".join(r for r in reasons if r is not None) or None

    def automatic(self, spec, call) -> Optional[str]:
        """The automatic choice takes triton for calls it compiles (CUDA tensors), never its interpreter."""
        if interpreting():
            return "triton is chosen automatically where it compiles for a CUDA device, not in its interpreter"
        return self.unsupported(spec, call)


#: The most table rows (Shaw 2k + 1, Huang 2M + 1 with its zero rows) a program holds, by input dtype: its (BM, R)
#: table logits and per-row weight sums pad R to a power of two. Shared memory at R = 129 .. 255 (256 padded), d =
#: 64, ``compile_program``, forward / dq / dk-dv: sm_80 float16 64 x 64 blocks 128 / 128 / 145 KiB, sm_80
#: float32 32 x 32 96 / 160 / 112 KiB (the limit 163), sm_90 float64 32 x 32 192 / 193 / 401 KiB (over the
#: 227 KiB limit; at 64 padded rows 104 / 144 / 202).
MAX_TABLE_ROWS = {torch.float64: 63}
DEFAULT_MAX_TABLE_ROWS = 255


def table_rows_unsupported(scheme, dtype) -> Optional[str]:
    """Why the scheme's tables have more rows than the programs hold in ``dtype``, or None."""
    module = None if scheme is None else schemes.module_for(scheme)
    if not hasattr(module, "fused_rows"):
        return None
    rows, limit = module.fused_rows(scheme), MAX_TABLE_ROWS.get(dtype, DEFAULT_MAX_TABLE_ROWS)
    if rows <= limit:
        return None
    return (
        f"triton holds each query block's logits against every table row: {type(scheme).__name__}'s {rows} rows "
        f"exceed the {limit} it holds for {str(dtype).removeprefix('torch.')} inputs (MAX_TABLE_ROWS; the tiles "
        "and flex kernels take any table)"
    )


def scheme_unsupported(scheme) -> Optional[str]:
    """Why the triton kernel cannot fuse ``scheme``, or None: it runs a q/k transform alone (RoPE), tables read by
    the clipped distance (Shaw, Huang: the ``fused_tables`` hook), biases of j - i alone (ALiBi, T5:
    ``distance_bias``) and Swin's table of 2-D offsets (``fused_pair_table``)."""
    if scheme is None or scheme.hooks == {"qk_transform"}:
        return None
    module = schemes.module_for(scheme)
    if hasattr(module, "fused_tables"):
        hook = getattr(module, "fused_unsupported", None)
        return None if hook is None else hook(scheme)
    if scheme.hooks == {"bias"} and (hasattr(module, "distance_bias") or hasattr(module, "fused_pair_table")):
        return None
    return (
        "triton fuses tables read by distance (Shaw, Huang), biases of j - i alone (ALiBi, T5), Swin's table and "
        f"q/k transforms (RoPE); {type(scheme).__name__} is none of them"
    )


def positions_unsupported(call) -> Optional[str]:
    """Why the call's positions are not an offset per batch (delta = j - i + off), or None (POS-1)."""
    for name in ("q_positions", "k_positions"):
        p = getattr(call, name)
        p = None if p is None else p.long()  # uint8 positions must not wrap around
        if p is not None and p.shape[-1] > 1 and not bool((p[..., 1:] - p[..., :-1] == 1).all()):
            return f"triton reads positions that are runs of consecutive integers; {name} is not (POS-1)"
    return None


def starts(call, device) -> torch.Tensor:
    """POS-1, POS-2 for consecutive positions: (1|B, 2) int32, each batch's first query and key positions
    (q_pos[b, 0], k_pos[b, 0]); (0, 0) by default. Query i is at q0 + i, key j at k0 + j."""
    first = [
        torch.zeros(1, dtype=torch.int64, device=device)
        if p is None
        else p.reshape(-1, p.shape[-1])[:, 0].long().to(device)
        for p in (call.q_positions, call.k_positions)
    ]
    pair = torch.stack(torch.broadcast_tensors(*first), 1)
    for name, column in (
        ("q_positions", pair[:, 0]),
        ("k_positions", pair[:, 1]),
        ("k_pos[0] - q_pos[0]", pair[:, 1] - pair[:, 0]),
    ):
        if int(column.abs().max()) >= 2**30:
            raise ValueError(f"{name}: expected within +-2**30 (int32 in the programs), got {int(column.abs().max())}")
    return pair.to(torch.int32).contiguous()


class _Distances(NamedTuple):
    """The distances lo .. hi as a call's ``delta`` (1, 1, n), for a scheme's bias hook (REL-3 (3))."""

    delta: torch.Tensor
    device: torch.device


class _SchemeBias(NamedTuple):
    """The scheme's bias as the programs read it: ``table`` (H, n) in the stat dtype (differentiable) and ``kind``
    (DIST): 1, the bias of each distance lo .. lo + n - 1 (ALiBi, T5); 2, Swin's table rows (``window``,
    ``prefix``); 0, none."""

    table: Optional[torch.Tensor] = None
    kind: int = 0
    lo: int = 0
    window: tuple = (1, 1)
    prefix: int = 0


def scheme_bias(spec, params: dict, call, first: torch.Tensor, stat) -> _SchemeBias:
    """The scheme's bias for the programs (ALiBi, T5: of each distance the call's pairs take; Swin: its table)."""
    scheme = spec.relative
    if scheme is None or "bias" not in scheme.hooks:
        return _SchemeBias()
    module = schemes.module_for(scheme)
    if hasattr(module, "fused_pair_table"):
        table, window, prefix = module.fused_pair_table(scheme, params)
        return _SchemeBias(table.to(stat).contiguous(), 2, 0, window, prefix)
    off = first[:, 1] - first[:, 0]
    lo, hi = 1 - call.Lq + int(off.min()), call.Lk - 1 + int(off.max())
    delta = torch.arange(lo, hi + 1, device=call.device).view(1, 1, -1)
    values = module.bias(scheme, params, _Distances(delta, call.device), num_heads=spec.num_heads, stat=stat)
    return _SchemeBias(values.reshape(spec.num_heads, -1).contiguous(), 1, lo)


@functools.cache
def _programs():
    """Triton and its three programs, decorated once per process; through the interpreter when no CUDA device is
    present."""
    imported = "triton" in sys.modules
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton
    import triton.language as tl

    if imported and interpreting() and not type(tl.standard.cdiv).__name__.startswith("Interpreted"):
        # Triton decorates its own library (tl.sum, tl.max, ...) when it is imported: imported before
        # TRITON_INTERPRET=1 (torch.compile and FlexAttention import it), those stay compiled functions, and the
        # interpreter fails inside the kernel with "Cannot call @triton.jit'd outside of the scope of a kernel"
        raise RuntimeError(
            "the triton kernel: Triton was imported in this process before TRITON_INTERPRET=1 was set (torch.compile "
            "and FlexAttention import it), so its interpreter cannot run here; expected TRITON_INTERPRET=1 before the "
            "first import of triton (or a fresh process), got a Triton imported for compiling"
        )
    from . import _fused_program as f

    return triton, triton.jit(f.forward), triton.jit(f.backward_dq), triton.jit(f.backward_dkdv)


#: Triton's names of the element types of the programs' pointers.
_TRITON_TYPES = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: Shared memory per block, in bytes, that CUDA lets a kernel use: sm_80 (A100) 163 KiB, sm_90 (H100, H200) 227 KiB.
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
#: The programs' pointers: of the stat dtype (PREC-4), and in the input dtype (``A`` is int8, ``OFF`` int32).
_STAT_POINTERS = frozenset({"DB", "OUT_STAT", "ROW_MAX", "ROW_INV", "DELTA", "DRK", "DRV", "DDB", "DBIAS"})
_INPUT_POINTERS = frozenset({"Q", "K", "V", "RK", "RV", "BIAS", "OUT", "DO", "DQ", "DK", "DV_"})


def compile_program(arch: int, dtype: torch.dtype, kernel: Triton = Triton(), *, d: int = 64, dv: int = 64,
                    max_distance: int = 16, causal: bool = True, masked: bool = True, keys: bool = True,
                    values: bool = True, dist: int = 1) -> dict:  # fmt: skip
    """The three programs compiled for a CUDA device of compute capability ``arch`` (80, 90) without one
    (blocks of ``kernel``'s fields, 64 where None):
    Triton lowers them to PTX and its bundled ptxas assembles cubins on this machine. {name: compiled}; a
    result's ``metadata.shared`` is the shared memory one program needs (check it against
    ``SHARED_MEMORY_LIMIT``). Needs a process in which Triton is not interpreting (``TRITON_INTERPRET`` unset
    when Triton is imported)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from . import _fused_program

    stat = "fp64" if dtype == torch.float64 else "fp32"
    bm, bn = kernel.block_m or 64, kernel.block_n or 64
    constexprs = dict(
        KMAX=max_distance, CAUSAL=causal, MASKED=masked, BIASED=masked, KEYS=keys, VALUES=values, DIST=dist,
        WH=3, WW=4, PREFIX=1, DIST_GRAD=bool(dist), BIAS_GRAD=masked, GROUP=1, BM=bm, BN=bn, DP=_pow2(d), DVP=_pow2(dv),
        RP=_pow2(2 * max_distance + 1), TP=_pow2(bm + bn - 1),
    )  # fmt: skip
    compiled = {}
    for name in ("forward", "backward_dq", "backward_dkdv"):
        fn = getattr(_fused_program, name)
        names = list(inspect.signature(fn).parameters)
        signature = {
            n: "constexpr" if n in constexprs
            else "*i8" if n == "A"
            else "*i32" if n == "OFF"
            else f"*{stat}" if n in _STAT_POINTERS
            else f"*{_TRITON_TYPES[dtype]}" if n in _INPUT_POINTERS
            else "fp32" if n in ("scale", "rel_scale")
            else "i32"
            for n in names
        }  # fmt: skip
        here = {(names.index(n),): v for n, v in constexprs.items() if n in names}
        compiled[name] = triton.compile(ASTSource(JITFunction(fn), signature, here), target=GPUTarget("cuda", arch, 32))
    return compiled


def _pow2(n: int) -> int:
    return max(16, 1 << max(n - 1, 0).bit_length())


class _Run(NamedTuple):
    """What the three programs share of one call besides the differentiable tensors."""

    block_m: int
    block_n: int
    mask: torch.Tensor  # int8, broadcast (B, H, Lq, Lk) view, or a dummy
    first: torch.Tensor  # (1|B, 2) int32, the first query and key positions
    bias: _SchemeBias
    kmax: int
    causal: bool
    masked: bool
    scale: float
    rel_scale: float


def _strides(t, n: int, dummy: bool) -> tuple:
    return (0,) * n if dummy else tuple(t.stride()[:n])


def _table3(t: Optional[torch.Tensor], dummy):
    """A table (R, c) | (H, R, c) as (1|H, R, c) contiguous, its head stride (0 when shared); the dummy when None."""
    if t is None:
        return dummy, 0
    t3 = (t if t.dim() == 3 else t.unsqueeze(0)).contiguous()
    return t3, t3.stride(0) if t3.shape[0] > 1 else 0


def _arguments(run: _Run, q, k, v, rel_k, rel_v, db, bias):
    """The pointers and strides the three programs take first, in their order, and (R, n); ``bias`` the
    broadcast (B, H, Lq, Lk) view of the bias input."""
    dummy = q.new_zeros(1)
    rk, srk = _table3(rel_k, dummy)
    rv, srv = _table3(rel_v, dummy)
    R = 2 * run.kmax + 1
    head = (q, k, v, rk, rv, dummy if db is None else db, run.first, run.mask, dummy if bias is None else bias)
    strides = (
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], srk, srv, 0 if db is None else db.stride(0),
        run.first.stride(0) if run.first.shape[0] > 1 else 0,
        *_strides(run.mask, 4, not run.masked), *_strides(bias, 4, bias is None),
    )  # fmt: skip
    return head, strides, R, 0 if db is None else db.shape[1]


def _constexprs(run: _Run, q, k, v, rel_k, rel_v, db, bias) -> dict:
    H, Hkv = q.shape[1], k.shape[1]
    return dict(
        KMAX=run.kmax, CAUSAL=run.causal, MASKED=run.masked, BIASED=bias is not None, KEYS=rel_k is not None,
        VALUES=rel_v is not None, DIST=run.bias.kind, WH=run.bias.window[0], WW=run.bias.window[1],
        PREFIX=run.bias.prefix, GROUP=H // Hkv, BM=run.block_m,
        BN=run.block_n, DP=_pow2(q.shape[3]), DVP=_pow2(v.shape[3]), RP=_pow2(2 * run.kmax + 1),
    )  # fmt: skip


class _Fused(torch.autograd.Function):
    """The three programs as one differentiable function of q, k, v, the Shaw tables, the distance bias and the
    bias input."""

    @staticmethod
    def forward(ctx, run: _Run, q, k, v, rel_k, rel_v, db, bias):
        triton, forward, _, _ = _programs()
        B, H, Lq, d = q.shape
        Lk, dv = k.shape[2], v.shape[3]
        stat = torch.float64 if q.dtype == torch.float64 else torch.float32
        o = q.new_empty(B, H, Lq, dv)
        keep = q.dtype != stat and any(ctx.needs_input_grad)  # 16-bit: dout . out from the unrounded output
        o_stat = torch.empty(B, H, Lq, dv, dtype=stat, device=q.device) if keep else o
        row_max, row_inv = (torch.empty(B, H, Lq, dtype=stat, device=q.device) for _ in range(2))
        wide = None if bias is None else _core.as_4d(bias).expand(B, H, Lq, Lk)
        head, strides, R, ND = _arguments(run, q, k, v, rel_k, rel_v, db, wide)
        forward[(triton.cdiv(Lq, run.block_m), B * H)](
            *head, o, o_stat, row_max, row_inv, *strides, *o.stride()[:3],
            H, Lq, Lk, d, dv, R, run.bias.lo, ND, run.scale, run.rel_scale,
            KEEP=keep, **_constexprs(run, q, k, v, rel_k, rel_v, db, wide),
        )  # fmt: skip
        ctx.run = run
        ctx.save_for_backward(q, k, v, rel_k, rel_v, db, bias, o_stat, row_max, row_inv)
        return o

    @staticmethod
    def backward(ctx, do):
        triton, _, backward_dq, backward_dkdv = _programs()
        run: _Run = ctx.run
        q, k, v, rel_k, rel_v, db, bias, o, row_max, row_inv = ctx.saved_tensors
        B, H, Lq, d = q.shape
        Hkv, Lk, dv = k.shape[1], k.shape[2], v.shape[3]
        stat = row_max.dtype
        do = do.contiguous()
        dsum = (do.to(stat) * o).sum(-1).contiguous()  # (B, H, Lq): do_i . out_i, sum_j p dP (the value term's too)
        wide = None if bias is None else _core.as_4d(bias).expand(B, H, Lq, Lk)
        head, strides, R, ND = _arguments(run, q, k, v, rel_k, rel_v, db, wide)
        const = _constexprs(run, q, k, v, rel_k, rel_v, db, wide)
        bm, bn = run.block_m, run.block_n
        nm = triton.cdiv(Lq, bm)
        dummy = q.new_zeros(1)
        dq = torch.empty_like(q)
        dk, dv_ = k.new_empty(B, Hkv, Lk, d), v.new_empty(B, Hkv, Lk, dv)
        drk = torch.zeros(B, H, nm, R, d, dtype=stat, device=q.device) if rel_k is not None else dummy
        drv = torch.zeros(B, H, nm, R, dv, dtype=stat, device=q.device) if rel_v is not None else dummy
        dist_grad = db is not None and ctx.needs_input_grad[6]
        ddb = torch.zeros(H, ND, dtype=stat, device=q.device) if dist_grad else dummy
        bias_grad = bias is not None and ctx.needs_input_grad[7]
        dbias = torch.zeros(_core.as_4d(bias).shape, dtype=stat, device=q.device) if bias_grad else dummy
        tail = (H, Lq, Lk, d, dv, R, run.bias.lo, ND, run.scale, run.rel_scale)
        backward_dq[(nm, B * H)](
            *head, do, row_max, row_inv, dsum, dq, drk, drv, ddb, dbias, *strides, *do.stride()[:3],
            *_strides(dbias.expand(B, H, Lq, Lk), 4, not bias_grad), *tail,
            DIST_GRAD=dist_grad, BIAS_GRAD=bias_grad, TP=_pow2(bm + bn - 1), **const,
        )  # fmt: skip
        backward_dkdv[(triton.cdiv(Lk, bn), B * Hkv)](
            *head, do, row_max, row_inv, dsum, dk, dv_, *strides, *do.stride()[:3], *tail, **const
        )  # fmt: skip

        def table_grad(partial, table):
            if table is None:
                return None
            g = partial.sum((0, 2))  # (H, R, c)
            return (g if table.dim() == 3 else g.sum(0)).to(table.dtype)

        return (
            None, dq, dk, dv_, table_grad(drk, rel_k), table_grad(drv, rel_v),
            ddb.to(db.dtype) if dist_grad else None, dbias.reshape(bias.shape).to(bias.dtype) if bias_grad else None,
        )  # fmt: skip


def attention(kernel: Triton, spec, params: dict, q, k, v, call: _core.Call) -> torch.Tensor:
    """q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv) -> o (B, H, Lq, dv), differentiable.

    Implements SCALE-2, SCALE-3, SCALE-4, SHAW-1..4, HUANG-1..3, HUANG-6, ALIBI-1, T5-1, SWIN-1, SWIN-3, SWIN-4,
    POS-5, ROPE-1, MASK-4, MASK-5, BIAS-1, BIAS-2, CAUSAL-1, WINDOW-1, POS-1, POS-2, HEAD-3, HEAD-4, SOFTMAX-1,
    GRAD-1, PREC-4.
    """
    q, k = transform_qk(spec, params, q, k, call)  # REL-3 (1): RoPE rotates q and k once
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    scheme = spec.relative
    module = None if scheme is None else schemes.module_for(scheme)
    rel_k, rel_v, kmax = module.fused_tables(scheme, params) if hasattr(module, "fused_tables") else (None, None, 0)
    stat = torch.float64 if q.dtype == torch.float64 else torch.float32
    first = starts(call, q.device)
    bias = scheme_bias(spec, params, call, first, stat)
    allowed = call.allowed  # the causal rule alone is computed in the programs (and bounds their loops)
    masked = allowed is not None and (call.mask is not None or call.bias is not None or spec.window is not None)
    run = _Run(
        *kernel.blocks(q.dtype),
        _core.as_4d(allowed).to(torch.int8).expand(B, H, Lq, Lk) if masked else q.new_zeros(1),
        first, bias._replace(table=None), kmax, spec.causal, masked, spec.effective_scale, spec.relative_scale,
    )  # fmt: skip
    return _Fused.apply(run, q.contiguous(), k.contiguous(), v.contiguous(), rel_k, rel_v, bias.table, call.bias)
