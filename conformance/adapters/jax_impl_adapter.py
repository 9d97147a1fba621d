"""``jax_impl``, attnspec's own JAX implementation, jit-compiled: every feature, CPU and GPU.

One adapter per kernel (KERN-1): ``jax`` lets ``jax_impl.attention`` choose
(``implementation=None``), ``jax:xla`` / ``jax:tiles`` / ``jax:pallas`` pin one kernel.

``jax_impl.attention`` uses ``implementation`` in one place, ``kernels.resolve``;
``jax`` asks the same function which kernel ``None`` resolves to for the
call and passes that kernel's name, so that its program is the one
``jax:tiles`` compiles for the case (the runner keeps the two in one
process: ``shares_programs_with``) instead of a second trace and lowering of
the same computation.
"""

from __future__ import annotations

import functools
from typing import ClassVar, Optional

import numpy as np

from . import _jax
from .base import FEATURES, Capabilities, few_tiles, fused_missing

DIFF_INPUTS = ("query", "key", "value", "bias")


class JaxImplAdapter(_jax.JaxAdapter):
    name = "jax"
    description = "jax_impl.attention under jax.jit (kernel chosen automatically), gradients by jax.vjp"
    implementation: ClassVar[Optional[str]] = None
    #: adapters whose compiled programs this one reuses when they run in the same process
    shares_programs_with: ClassVar[tuple] = ("jax:tiles",)

    def capabilities(self):
        self.environment()
        return Capabilities(devices=_jax.devices())

    @staticmethod
    def _call(spec, precision, implementation):
        """f(params, diff, other, weights): ``jax_impl.attention`` on the differentiable inputs ``diff``
        (query, key, value, bias when given) and the others, under the case's matmul precision."""
        import jax

        import jax_impl

        def f(params, diff, other, weights):
            with jax.default_matmul_precision(precision):
                return jax_impl.attention(
                    spec,
                    params,
                    diff["query"],
                    diff.get("key"),
                    diff.get("value"),
                    bias=diff.get("bias"),
                    **other,
                    return_weights=weights,
                    implementation=implementation,
                )

        return f

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _compiled(spec, precision, implementation):
        """(out_w, weights, out, grads) = f(params, called_inputs, other_inputs, grad_out), jitted per spec.

        One program per case and dtype holds the call that asks for weights, the call that does not (a
        kernel's other path), and the gradients of the latter (what training differentiates).
        """
        import jax

        f = JaxImplAdapter._call(spec, precision, implementation)

        def fwd_vjp(params, called, other, g, omitted):
            # The forward of a case that omits key and/or value (SHAPE-2) is called without them, while
            # its gradients are partials for three separate inputs. Those inputs are leaves of their own
            # that hold the very array they stand for (key = query, value = key): jax.vjp gives each leaf
            # its own partial, and XLA sees one forward computation where it would see two on copies.
            explicit = _explicit(called, omitted)
            out_w, weights = f(params, called, other, True)
            out, pullback = jax.vjp(lambda p, d: f(p, d, other, False), params, explicit)
            if omitted:
                out = f(params, called, other, False)
            return out_w, weights, out, pullback(g)

        return jax.jit(fwd_vjp, static_argnames="omitted")

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _compiled_forward(spec, precision, implementation):
        """out = f(params, called_inputs, other_inputs) alone, jitted per spec (``forward_only``)."""
        import jax

        f = JaxImplAdapter._call(spec, precision, implementation)
        return jax.jit(lambda params, called, other: f(params, called, other, False))

    def kernel_name(self, spec, inputs) -> Optional[str]:
        """The ``implementation=`` this adapter passes: its own, or for ``jax`` the name of the kernel
        (with its default knobs) that ``kernels.resolve(None, ...)`` picks for both calls of the case
        (with and without weights); None where it picks different ones (KERN-1)."""
        if self.implementation is not None:
            return self.implementation
        from jax_impl import kernels

        given = {n: inputs.get(n) for n in ("key", "mask", "bias", "q_positions", "k_positions", "dropout_keep")}
        calls = [kernels.Call.of(inputs["query"], **given, return_weights=w) for w in (True, False)]
        chosen = {kernels.resolve(None, spec, c) for c in calls}
        if len(chosen) != 1:
            return None
        (kernel,) = chosen
        return kernel.name if kernel == kernels.resolve(kernel.name, spec, calls[0]) else None

    def runs_as(self, spec, inputs) -> Optional[str]:
        """``jax``: the kernel adapter whose cell is this one's call for call (``kernel_name`` resolves
        both calls to exactly the kernel object that adapter pins, so both compile one program); the
        pinned adapters: None."""
        if self.implementation is not None:
            return None
        kernel = self.kernel_name(spec, inputs)
        return None if kernel is None else f"jax:{kernel}"

    def _arguments(self, params, inputs, device):
        """(params, called, other, omitted) as jax arrays: the inputs the call passes (key and value
        left out where the case omits them) and the names it omits."""
        omitted, inputs = omitted_inputs(inputs)
        p = {n: _jax.to_jax(a, device) for n, a in params.items()}
        called = {n: _jax.to_jax(inputs[n], device) for n in DIFF_INPUTS if n in inputs and n not in omitted}
        other = {n: _jax.to_jax(a, device) for n, a in inputs.items() if n not in DIFF_INPUTS}
        return p, called, other, omitted

    def _run(self, spec, params, inputs, grad_out, device):
        x = inputs["query"]
        fn = self._compiled(spec, _jax.matmul_precision(x.dtype.name), self.kernel_name(spec, inputs))
        p, called, other, omitted = self._arguments(params, inputs, device)
        g = _jax.to_jax(np.zeros(x.shape, x.dtype) if grad_out is None else grad_out, device)
        return fn(p, called, other, g, omitted=omitted)

    def forward_only(self, spec, params, inputs, *, device):
        """The forward of a call whose gradients are never asked for, compiled without them."""
        x = inputs["query"]
        fn = self._compiled_forward(spec, _jax.matmul_precision(x.dtype.name), self.kernel_name(spec, inputs))
        p, called, other, _ = self._arguments(params, inputs, device)
        return {"out": np.asarray(fn(p, called, other))}

    def forward(self, spec, params, inputs, *, device, need_weights):
        out_w, weights, out, _ = self._run(spec, params, inputs, None, device)
        if need_weights:
            return {"out": np.asarray(out_w), "weights": np.asarray(weights)}
        return {"out": np.asarray(out)}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        _, _, _, (g_params, g_inputs) = self._run(spec, params, inputs, grad_out, device)
        return {n: np.asarray(g) for n, g in {**g_params, **g_inputs}.items()}

    def roundtrip_params(self, spec, params):
        from flax import nnx

        import jax_impl

        m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0), dtype=params["wq"].dtype)
        return m.load_canonical({n: np.asarray(a) for n, a in params.items()}).canonical_params()


def omitted_inputs(inputs: dict) -> tuple:
    """(omitted, inputs): the names of key and value a case's forward omits (SHAPE-2), and the inputs with
    explicit key and value. A vjp call carries explicit copies (of the query for self-attention, of the key
    for an omitted value); recognising them lets the forward and the gradients of a case share one compiled
    program."""
    x = inputs["query"]
    key = inputs.get("key", x)
    value = inputs.get("value", key)
    if "key" not in inputs or (np.array_equal(key, x) and np.array_equal(value, x)):
        omitted = ("key", "value")
    elif "value" not in inputs or np.array_equal(value, key):
        omitted = ("value",)
    else:
        omitted = ()
    return omitted, {**inputs, "key": key, "value": value}


def _explicit(called: dict, omitted: tuple) -> dict:
    """The called inputs with the omitted key and value as leaves of their own that hold the very array they
    stand for (key = query, value = key), so that jax.vjp gives each its own partial (SHAPE-2)."""
    explicit = dict(called)
    if "key" in omitted:
        explicit["key"] = called["query"]
    if "value" in omitted:
        explicit["value"] = explicit["key"]
    return explicit


class JaxXlaAdapter(JaxImplAdapter):
    name = "jax:xla"
    description = "jax_impl with implementation='xla': whole logits, the readable baseline"
    implementation = "xla"


class JaxTilesAdapter(JaxImplAdapter):
    name = "jax:tiles"
    description = "jax_impl with implementation='tiles': skew, banded Shaw sums, causal query tiles"
    implementation = "tiles"


class JaxSmallTilesAdapter(JaxTilesAdapter):
    """The tiles kernel cut into a few query tiles per call, whatever its size (the mutation campaign's jax:tiles).

    With its default knobs (``Tiles(query_rows=256)``) the tiles kernel cuts
    a call into query tiles only under a plain causal rule (CAUSAL-1 alone:
    default positions, no mask, bias or mask_fill) from Lq = 512 on, so the
    catalog's short cases run as one tile, and a kernel that is right on its
    first tile would pass. This adapter sizes the knob to each call,
    ``Tiles(query_rows=T)`` with ``T = max(2, ceil(Lq / 3))`` (``kernel_name``):
    every plain causal call of four queries or more (Lq >= 2T) is cut into two
    to four query tiles, each reading the keys up to its last query only, the
    last tile partial where T does not divide Lq (Lq = 5: tiles of 2, 2 and 1
    queries); the long cases (L = 512 .. 640) get three tiles, not hundreds.
    Other calls (and one to three queries) run as one tile, as with the
    default knob. Not a built-in adapter: ``python -m conformance run
    --adapter conformance.adapters.jax_impl_adapter:JaxSmallTilesAdapter``
    certifies it.
    """

    name = "jax:tiles-small"
    description = (
        "jax_impl with implementation=Tiles(query_rows=T), T = max(2, ceil(Lq / 3)): the tiles kernel cut into a "
        "few query tiles per plain causal call"
    )
    shares_programs_with = ()
    #: query tiles per call (about), and the fewest rows of a tile
    QUERY_TILES = 3
    MIN_ROWS = 2

    @classmethod
    def query_rows(cls, Lq: int) -> int:
        """T = max(2, ceil(Lq / 3))."""
        return few_tiles(Lq, cls.QUERY_TILES, cls.MIN_ROWS)

    def kernel_name(self, spec, inputs):
        """The kernel object of this call: ``Tiles(query_rows=T)`` (hashable, so one program per case and T)."""
        from jax_impl.kernels import Tiles

        return Tiles(query_rows=self.query_rows(inputs["query"].shape[1]))


#: What the pallas kernel cannot be asked for (KERN-1): its program fuses Shaw's tables at default positions.
PALLAS_MISSING = fused_missing("pallas")
#: Why the jax:pallas cells skip their gradient checks: the kernel's custom VJP runs the tiles kernel's VJP, the
#: very programs jax:tiles certifies; compiling them again per case would double this adapter's time.
PALLAS_GRADIENTS = (
    "the pallas kernel's backward is the tiles kernel's VJP (certified as jax:tiles); "
    "tests/test_jax_pallas.py checks its custom VJP against numpy_ref's"
)


class JaxPallasAdapter(JaxImplAdapter):
    name = "jax:pallas"
    description = (
        "jax_impl with implementation='pallas': one fused Pallas program with Shaw's key and value terms; "
        "interpret mode on the CPU, lowered to Triton on GPU; its backward is the tiles kernel's VJP"
    )
    implementation = "pallas"
    shares_programs_with = ()

    def capabilities(self):
        self.environment()
        devices = _jax.devices()
        return Capabilities(
            devices=devices,
            features=FEATURES - set(PALLAS_MISSING),
            weights=False,
            notes=dict(PALLAS_MISSING),
            no_gradients=dict.fromkeys(devices, PALLAS_GRADIENTS),
        )

    def forward(self, spec, params, inputs, *, device, need_weights):
        """The forward alone (the kernel returns no weights)."""
        return self.forward_only(spec, params, inputs, device=device)


def _pow2_at_most(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (max(n, 1).bit_length() - 1)


class JaxSmallBlocksPallasAdapter(JaxPallasAdapter):
    """The pallas kernel cut into a few blocks of queries and keys per call (the mutation campaign's jax:pallas).

    With its default knobs (``Pallas(block_q=16, block_k=16)``) a catalog case
    of up to 16 queries and keys is one program over one key block: its grid,
    the online softmax across key blocks, the causal stop at the diagonal
    block and the padding of a partial block are never crossed. This adapter
    sizes the blocks to each call, in interpret mode (which takes blocks below
    Triton's 16): ``Pallas(block_q=BQ, block_k=BK, interpret=True)`` with BQ
    the largest power of two <= ceil(Lq / 3) and BK the largest power of two
    <= ceil(Lk / 2) (``kernel_name``). The catalog's commonest call (Lq = 5,
    Lk = 7) gets three programs of two queries per (batch, head), each walking
    two blocks of four keys, the last of each partial; BQ and BK differ, as
    the causal stop's arithmetic allows; the long cases (L = 640) get five
    blocks of 128 queries and three of 256 keys. Not a built-in adapter:
    ``python -m conformance run --adapter
    conformance.adapters.jax_impl_adapter:JaxSmallBlocksPallasAdapter`` certifies it.
    """

    name = "jax:pallas-small"
    description = (
        "jax_impl with implementation=Pallas(block_q=BQ, block_k=BK, interpret=True), BQ <= ceil(Lq / 3) and "
        "BK <= ceil(Lk / 2) powers of two: the pallas kernel cut into a few blocks per call"
    )
    #: blocks of queries and of keys per call (about)
    QUERY_BLOCKS = 3
    KEY_BLOCKS = 2

    @classmethod
    def blocks(cls, Lq: int, Lk: int) -> tuple:
        """(BQ, BK): the largest powers of two at most ceil(Lq / 3) and ceil(Lk / 2)."""
        return _pow2_at_most(few_tiles(Lq, cls.QUERY_BLOCKS)), _pow2_at_most(few_tiles(Lk, cls.KEY_BLOCKS))

    def kernel_name(self, spec, inputs):
        """The kernel object of this call (hashable, so one program per case and block sizes)."""
        from jax_impl.kernels import Pallas

        block_q, block_k = self.blocks(inputs["query"].shape[1], inputs.get("key", inputs["query"]).shape[1])
        return Pallas(block_q=block_q, block_k=block_k, interpret=True)
