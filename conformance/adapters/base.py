"""The adapter protocol: how the harness talks to an implementation.

An adapter is one small class. Everything crosses the boundary as NumPy
arrays (16-bit floats as ``float16`` and ``ml_dtypes.bfloat16``); the adapter
converts to its framework, computes in the dtype it was given, and converts
back. It declares what it can do in ``capabilities()``; the harness builds
the matrix from that, explains every skip, and treats a failure of a
declared capability as a failure.

Feature names an adapter may declare (a case needs the features its spec
and inputs use; see ``conformance.cases.Case.features``):

    cross-attention      separate key / value inputs (else self-attention only)
    custom-scale         AttentionSpec.scale (SCALE-1)
    no-projection-bias   AttentionSpec.bias = False (PROJ-1)
    causal               AttentionSpec.causal (CAUSAL-1)
    mask                 boolean masks of every broadcast rank (MASK-1)
    bias                 additive bias input with -inf entries (BIAS-1, BIAS-2)
    positions            explicit q_positions / k_positions (POS-1)
    mask-fill            AttentionSpec.mask_fill (MASK-6)
    dropout-spec         AttentionSpec.dropout > 0 without a keep mask (DROP-3)
    dropout-keep         explicit dropout keep masks (DROP-1)
    shaw, shaw-values    Shaw key terms, Shaw value terms
    shaw-key-side        Shaw's key-side term, k_j . table[idx] (SHAW-6, SHAW-7)
    huang                Huang relative keys
    huang-values         Huang's value term (HUANG-6)
    per-head-tables      per_head=True tables (REL-2)
    unscaled-relative    scale_relative=False (SCALE-3)
    grouped-kv-heads     AttentionSpec.num_kv_heads < num_heads (HEAD-3)
    value-head-dim       AttentionSpec.value_head_dim != head_dim (HEAD-4)
    softcap              AttentionSpec.softcap (SOFTCAP-1)
    window               AttentionSpec.window (WINDOW-1)
    rope                 Rope, the half layout, r = d, attention factor 1 (ROPE-1..ROPE-9)
    rope-interleaved     Rope(layout="interleaved") (ROPE-3)
    rope-partial         Rope with its own rotary_dim or inv_freq: r may differ from d,
                         frequencies may be any (ROPE-2, ROPE-4)
    rope-attention-factor  Rope.attention_factor != 1 (ROPE-7)
    validates-input      rejects bad arguments per INPUT-1 (error cases)
    rejects-bad-bias-values, validates-vjp-input
                         the reference's own checks (REFERENCE_FEATURES, not in the default set)
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import numpy as np

FEATURES = frozenset(
    {
        "cross-attention",
        "custom-scale",
        "no-projection-bias",
        "causal",
        "mask",
        "bias",
        "positions",
        "mask-fill",
        "dropout-spec",
        "dropout-keep",
        "shaw",
        "shaw-values",
        "shaw-key-side",
        "huang",
        "huang-values",
        "per-head-tables",
        "unscaled-relative",
        "grouped-kv-heads",
        "value-head-dim",
        "softcap",
        "window",
        "rope",
        "rope-interleaved",
        "rope-partial",
        "rope-attention-factor",
        "alibi",
        "alibi-linear",
        "t5",
        "t5-causal",
        "swin",
        "swin-prefix",
        "validates-input",
    }
)
#: What a fused vanilla attention call with the canonical projections around it takes (SDPA, jax.nn, ONNX's
#: Attention): the base of those adapters' feature sets.
PLAIN_FEATURES = frozenset({"cross-attention", "custom-scale", "no-projection-bias", "causal", "mask", "bias"})
#: Checks that only the reference's own entry points promise, declared by its adapter alone (not in the
#: default feature set): BIAS-2's rejection of NaN and +inf in ``bias`` ("elsewhere they give an
#: unspecified result"), and the argument checks of ``numpy_ref.attention_vjp`` (a framework's gradient
#: comes from its autodiff, which has no entry point of the implementation's to check ``grad_out``).
REFERENCE_FEATURES = frozenset({"rejects-bad-bias-values", "validates-vjp-input"})
DTYPES = ("float64", "float32", "bfloat16", "float16")


def few_tiles(n: int, tiles: int, least: int = 1) -> int:
    """The rows of a tile that cuts ``n`` rows into about ``tiles`` tiles, at least ``least``:
    ``max(least, ceil(n / tiles))`` (the mutation campaign's small-tile adapters, torch's and jax's)."""
    return max(least, -(-n // tiles))


def fused_missing(kernel: str) -> dict:
    """What a fused kernel that computes Shaw's tables at default positions (torch_impl's ``triton``, jax_impl's
    ``pallas``) cannot be asked for: feature -> the reason, for ``Capabilities.notes``."""
    others = f"the {kernel} kernel fuses Shaw's tables only"
    return {
        "huang": others,
        "huang-values": others,
        "shaw-key-side": f"the {kernel} kernel has no key-side term (SHAW-6)",
        "positions": f"the {kernel} kernel indexes its tables by j - i: default positions only",
        "softcap": f"the {kernel} kernel has no soft cap",
        "mask-fill": f"the {kernel} kernel gives disallowed keys weight 0 only",
        "dropout-keep": f"the {kernel} kernel takes no keep mask",
        **{f: others for f in sorted(FEATURES) if f.startswith(("rope", "alibi", "t5", "swin"))},
    }


@dataclass(frozen=True)
class Capabilities:
    dtypes: tuple = DTYPES
    devices: tuple = ("cpu",)  # the devices present *now*; "cuda" / "gpu" when available
    features: frozenset = FEATURES
    weights: bool = True  # returns attention weights (SOFTMAX-2)
    gradients: bool = True  # implements vjp (GRAD-1)
    # device -> why the gradients cannot be computed there (the cell's gradient checks skip with that reason,
    # the rest of the cell runs): a framework whose backward is missing on one device only
    no_gradients: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)  # feature -> why it is missing, for skip messages
    unsupported: dict = field(default_factory=dict)  # (device, dtype) -> why that pair cannot run
    # features a case must use for this adapter to run it: an adapter of an outside RoPE (around a
    # plain core of the harness's own) certifies only the rotation, so it skips cases without one
    requires: frozenset = frozenset()

    def __post_init__(self):
        unknown = (set(self.features) | set(self.requires)) - FEATURES - REFERENCE_FEATURES
        if unknown:
            known = sorted(FEATURES | REFERENCE_FEATURES)
            raise ValueError(f"Capabilities.features: expected names from {known}, got {sorted(unknown)}")


class Adapter(abc.ABC):
    """One implementation under test.

    ``inputs`` passed to ``forward`` / ``vjp`` hold ``query`` and, when
    present, ``key``, ``value`` (absent = self-attention, SHAPE-2), ``mask``,
    ``bias``, ``q_positions``, ``k_positions``, ``dropout_keep``. ``params``
    are canonical (PARAM-1), in the case's dtype.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""

    def unavailable(self) -> Optional[str]:
        """Why this adapter cannot run here (e.g. its framework is not installed), or None."""
        return None

    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abc.abstractmethod
    def forward(self, spec, params: dict, inputs: dict, *, device: str, need_weights: bool) -> dict:
        """{"out": (B, Lq, D), "weights": (B, H, Lq, Lk) when need_weights}."""

    def vjp(self, spec, params: dict, inputs: dict, grad_out: np.ndarray, *, device: str) -> dict:
        """Gradients of <out, grad_out>: "query", "key", "value", "bias" (if given), every param.

        ``inputs`` here always hold explicit key and value arrays: the three
        gradients are partials with respect to three separate inputs.
        """
        raise NotImplementedError(f"{self.name} declares no gradients")

    def environment(self) -> dict:
        """Versions and numerics settings in force (recorded in reports)."""
        return {}

    def release(self) -> None:
        """Free what was cached for the cases run so far; the harness calls it after each case.

        A compiled program per case and dtype adds up: XLA's CPU executables
        each map memory pages, and a whole run of several JAX adapters in one
        process ran out of memory maps (vm.max_map_count) before this hook.
        """

    # Optional hooks, used when an adapter defines them:
    #   unsupported_case(case) -> str | None     why this case cannot be expressed in the library's own
    #                                            arguments (a skip with that reason), beyond what features say
    #   roundtrip_params(spec, params) -> dict   PARAM-3: canonical -> module -> canonical
    #   forward_only(spec, params, inputs, *, device) -> dict
    #                                            {"out"} of a call whose gradients the harness never asks
    #                                            for (the twins' and decoding calls): an adapter that
    #                                            compiles forward and gradients as one program per call
    #                                            compiles the forward alone here
    #   own_process = True                       a class attribute: a parallel run (``--jobs``, which
    #                                            rebuilds adapters by name) runs each of this adapter's
    #                                            (dtype) shares in a fresh process of its own, never in a
    #                                            worker another adapter used (``torch:triton``: Triton's
    #                                            interpreter needs a process that imported Triton with it)
    #   runs_as(spec, inputs) -> str | None      the name of another adapter, one of its
    #                                            ``shares_programs_with``, whose cell for this call runs the
    #                                            very same code (one kernel, one compiled program): a run
    #                                            that holds both in one process runs that cell once and
    #                                            reports it under both names (``jax``, whose automatic
    #                                            choice resolves to the kernel ``jax:tiles`` pins)
