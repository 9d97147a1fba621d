"""``torch_impl``, attnspec's own PyTorch implementation: every feature, CPU and CUDA.

One adapter per kernel (KERN-1), so that each is certified on its own:
``torch`` lets ``torch_impl.attention`` choose (``implementation=None``),
``torch:eager`` / ``torch:sdpa`` / ``torch:tiles`` / ``torch:flex`` / ``torch:triton`` pin one kernel.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from . import _torch
from .base import FEATURES, Capabilities, few_tiles

KWARGS = ("mask", "bias", "q_positions", "k_positions", "dropout_keep")
DENSE = ("query", "key", "value", "bias")


class TorchImplAdapter(_torch.TorchAdapter):
    name = "torch"
    description = "torch_impl.attention (functional core, kernel chosen automatically) and its nn.Module"
    implementation: ClassVar[Optional[str]] = None

    def capabilities(self):
        return Capabilities(devices=_torch.devices())

    def _call(self, spec, params, inputs, device, requires_grad, need_weights):
        import torch_impl

        t = {
            n: _torch.to_torch(a, device, requires_grad and n in (*DENSE, *params))
            for n, a in {**params, **inputs}.items()
        }
        p = {n: t[n] for n in params}
        kw = {n: t[n] for n in KWARGS if n in t}
        result = torch_impl.attention(
            spec,
            p,
            t["query"],
            t.get("key"),
            t.get("value"),
            **kw,
            return_weights=need_weights,
            implementation=self.kernel_for(device, inputs),
        )
        return t, result

    def kernel(self, device):
        """The ``implementation`` argument of this adapter's calls on ``device``."""
        return self.implementation

    def kernel_for(self, device, inputs: dict):
        """The ``implementation`` argument of one call with these (NumPy) inputs: ``kernel(device)`` unless an
        adapter sizes its kernel to the call."""
        return self.kernel(device)

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        with torch.no_grad():
            _, result = self._call(spec, params, inputs, device, False, need_weights)
        if need_weights:
            return {"out": _torch.to_numpy(result[0]), "weights": _torch.to_numpy(result[1])}
        return {"out": _torch.to_numpy(result)}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        t, out = self._call(spec, params, inputs, device, True, False)
        out.backward(_torch.to_torch(grad_out, device))
        return {n: _torch.to_numpy(x.grad) for n, x in t.items() if x.requires_grad}

    def roundtrip_params(self, spec, params):
        import torch_impl

        m = torch_impl.MultiHeadAttention(spec, dtype=_torch.dtype_of(params["wq"]))
        return m.load_canonical(params).canonical_params()


class TorchEagerAdapter(TorchImplAdapter):
    name = "torch:eager"
    description = "torch_impl with implementation='eager': whole logits, the readable baseline"
    implementation = "eager"


class TorchTilesAdapter(TorchImplAdapter):
    name = "torch:tiles"
    description = "torch_impl with implementation='tiles': cache-sized tiles, skew and banded Shaw sums"
    implementation = "tiles"


class TorchSmallTilesAdapter(TorchTilesAdapter):
    """The tiles kernel cut into a few tiles per call, whatever its size (the mutation campaign's torch:tiles).

    With its default knobs the tiles kernel puts each (batch, head) pair of
    up to 1 Mi logits in one tile, so the catalog's cases (a few queries and
    keys) never reach a second tile. This adapter sizes the knobs to each
    call, ``Tiles(elements=2 * T * Lk, query_rows=T, min_rows=2)`` with
    ``T = max(2, ceil(Lq / 3))`` (``kernel_for``):

    - a call with short tiles (a causal prefix or a window's right bound,
      CAUSAL-1, WINDOW-1; a key or value term at default positions) gets
      query tiles of T rows and two (batch, head) pairs: both heads of one
      batch element when H = 2, two batch elements when H = 1, two heads of
      one batch element when H > 2 (HEAD-3: a group of heads kept whole or
      split evenly); a causal tile reads the keys up to its last query only;
    - any other call gets tiles of 2T rows and one (batch, head) pair each
      (2T < Lq from Lq = 5 on), the last tile of a pair partial;
    - a call of one or two queries (decoding) gets tiles of several pairs.

    So every case crosses tile boundaries, at every size: the long cases
    (L = 512 .. 640) get three or four query tiles, not hundreds. Not a
    built-in adapter: ``python -m conformance run --adapter
    conformance.adapters.torch_impl_adapter:TorchSmallTilesAdapter`` certifies it.
    """

    name = "torch:tiles-small"
    description = (
        "torch_impl with implementation=Tiles(elements=2 * T * Lk, query_rows=T, min_rows=2), T = max(2, "
        "ceil(Lq / 3)): the tiles kernel cut into a few tiles per call"
    )
    #: query tiles per (batch, head) pair (about), and (batch, head) pairs per short tile
    QUERY_TILES = 3
    PAIRS = 2
    MIN_ROWS = 2

    def kernel_for(self, device, inputs: dict):
        from torch_impl.kernels import Tiles

        Lq = inputs["query"].shape[1]
        Lk = inputs.get("key", inputs["query"]).shape[1]
        rows = few_tiles(Lq, self.QUERY_TILES, self.MIN_ROWS)
        return Tiles(elements=self.PAIRS * rows * Lk, query_rows=rows, min_rows=self.MIN_ROWS)


#: What F.scaled_dot_product_attention cannot be asked for: no relative terms, no
#: replacement fill, no soft cap, no explicit keep mask, and it returns no weights.
#: (Grouped key/value heads, a value head size and windows it runs: HEAD-3, HEAD-4, WINDOW-1.)
SDPA_MISSING = {
    "shaw": "the sdpa kernel takes no relative scheme (use eager or tiles)",
    "shaw-values": "the sdpa kernel takes no relative scheme",
    "shaw-key-side": "the sdpa kernel takes no relative scheme",
    "huang-values": "the sdpa kernel takes no relative scheme",
    "huang": "the sdpa kernel takes no relative scheme",
    "per-head-tables": "the sdpa kernel takes no relative scheme",
    "unscaled-relative": "the sdpa kernel takes no relative scheme",
    "mask-fill": "the sdpa kernel gives disallowed keys exactly 0 only (MASK-5), no fill value",
    "dropout-keep": "the sdpa kernel draws no explicit keep mask",
    "softcap": "the sdpa kernel has no score modification: SOFTCAP-1 caps the score before the masks",
}


class TorchSDPAKernelAdapter(TorchImplAdapter):
    name = "torch:sdpa"
    description = "torch_impl with implementation='sdpa': F.scaled_dot_product_attention for vanilla calls"
    implementation = "sdpa"

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(), features=FEATURES - set(SDPA_MISSING), weights=False, notes=dict(SDPA_MISSING)
        )


#: What the flex kernel cannot be asked for (KERN-1): the weights never leave FlexAttention.
FLEX_MISSING = {
    "huang-values": "the flex kernel computes Shaw's value term only (from FlexAttention's log-sum-exp)",
    "dropout-keep": "the flex kernel takes no dropout_keep mask (DROP-1)",
}
#: PyTorch's FlexAttention has a backward on CUDA only (torch 2.13).
FLEX_NO_CPU_GRADIENTS = (
    "PyTorch's FlexAttention has no backward on the CPU (torch 2.13 raises NotImplementedError: "
    "FlexAttention does not support backward on CPU); its CUDA cells check the gradients"
)


class TorchFlexAdapter(TorchImplAdapter):
    name = "torch:flex"
    description = (
        "torch_impl with implementation='flex': FlexAttention with every per-pair logit term in one score_mod; "
        "called eagerly on the CPU (forward only there), compiled on CUDA"
    )

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=FEATURES - set(FLEX_MISSING),
            weights=False,
            notes=dict(FLEX_MISSING),
            no_gradients={"cpu": FLEX_NO_CPU_GRADIENTS},
        )

    def unsupported_case(self, case):
        f = case.features()
        if "shaw-values" in f and "positions" in f:
            return (
                "the flex kernel computes Shaw's value term at default positions only (one key per query and distance)"
            )
        return None

    def kernel(self, device):
        """Eager on the CPU: one compilation per case, dtype and call shape would cost about 1 s each, and the
        compiled CPU kernel is checked against the eager one by tests/test_torch_kernels.py."""
        from torch_impl.kernels import Flex

        return Flex(compiled=device != "cpu")


#: What the triton kernel cannot be asked for (KERN-1): it fuses Shaw's and Huang's tables, RoPE, ALiBi, T5 and Swin.
TRITON_MISSING = {
    "shaw-key-side": "the triton kernel has no key-side term (SHAW-6)",
    "softcap": "the triton kernel has no soft cap",
    "mask-fill": "the triton kernel gives disallowed keys weight 0 only",
    "dropout-keep": "the triton kernel takes no keep mask",
}
#: Position recipes (POS-1) that are runs of consecutive integers: delta = j - i + an offset per batch element.
CONSECUTIVE_POSITIONS = frozenset({"bottom-right", "shifted", "per-batch", "per-batch-offsets", "far"})


class TorchTritonAdapter(TorchImplAdapter):
    name = "torch:triton"
    description = (
        "torch_impl with implementation='triton': fused Triton programs (forward and backward) with Shaw's and "
        "Huang's key and value terms, RoPE, ALiBi, T5 and Swin; Triton's interpreter on the CPU, compiled on CUDA"
    )
    implementation = "triton"
    #: on a CPU, Triton must be imported with its interpreter on: torch.compile and FlexAttention (torch:flex,
    #: torch:sdpa's peers) import it for compiling in any worker they ran in
    own_process = True

    def unavailable(self):
        from torch_impl.kernels.fused import triton_unavailable

        return super().unavailable() or triton_unavailable()

    def capabilities(self):
        from torch_impl.kernels.fused import BFLOAT16_IN_INTERPRETER

        return Capabilities(
            devices=_torch.devices(),
            features=FEATURES - set(TRITON_MISSING),
            weights=False,
            notes=dict(TRITON_MISSING),
            unsupported={("cpu", "bfloat16"): BFLOAT16_IN_INTERPRETER},
        )

    def unsupported_case(self, case):
        import torch

        from torch_impl.kernels.fused import table_rows_unsupported

        rows = table_rows_unsupported(case.spec.relative, torch.float64)  # the smallest limit: one skip per case
        if rows:
            return rows
        kinds = {r.kind for r in case.recipes if type(r).__name__ == "Positions"}
        if kinds - CONSECUTIVE_POSITIONS:
            return (
                f"the triton kernel reads positions that are runs of consecutive integers (an offset per batch "
                f"element); the case's are {', '.join(sorted(kinds - CONSECUTIVE_POSITIONS))}"
            )
        return None
