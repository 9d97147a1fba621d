"""``MultiHeadAttention``: an ``nn.Module`` that owns the parameters and calls the core.

Parameters are stored the way PyTorch users expect: ``q_proj``, ``k_proj``,
``v_proj``, ``out_proj`` are ``nn.Linear`` layers (weight ``(out, in)``),
``rel_k`` / ``rel_q`` / ``rel_v`` (Shaw, Huang) and ``rel_b`` (T5, Swin) are tables of
the canonical shape (``TABLES``). Every size comes from
``spec.param_shapes()`` (PARAM-1): with Hkv key/value heads (HEAD-3) and
value heads of dv channels (HEAD-4), ``k_proj`` maps D to Hkv * d,
``v_proj`` D to Hkv * dv and ``out_proj`` H * dv to D. ``load_canonical``
and ``canonical_params`` convert to and from the canonical ``(in, out)``
layout exactly (PARAM-3).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from spec import AttentionSpec
from spec.validation import ArrayInfo, check_params, fail_type

from . import _checks, functional

#: The relative position tables a scheme may add (PARAM-1), stored as parameters under their canonical names.
TABLES = ("rel_k", "rel_q", "rel_v", "rel_b")


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's exact values as NumPy (bfloat16 through ml_dtypes)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(
                "bfloat16 parameters: expected ml_dtypes to be installed to export them to NumPy "
                "exactly (pip install ml_dtypes)"
            ) from None
        return np.ascontiguousarray(t.float().numpy().astype(ml_dtypes.bfloat16))
    return np.array(t.numpy(), order="C", copy=True)


def from_numpy(a, dtype: torch.dtype, device) -> torch.Tensor:
    """Exact conversion of a NumPy array (or tensor) to a tensor of ``dtype``; refuses any cast."""
    if isinstance(a, torch.Tensor):
        t = a.detach()
        got = str(t.dtype)
    else:
        a = np.asarray(a)
        got = a.dtype.name
        t = torch.from_numpy(a.astype(np.float32)) if got == "bfloat16" else torch.from_numpy(np.ascontiguousarray(a))
        if got == "bfloat16":
            t = t.to(torch.bfloat16)
    if t.dtype != dtype:
        raise fail_type("params", f"arrays of the module's dtype {dtype} (cast them explicitly first)", f"dtype {got}")
    return t.to(device)


def _describe(name: str, a) -> ArrayInfo:
    """A tensor or NumPy array (bfloat16 through ml_dtypes) as the checks see it (INPUT-1)."""
    if isinstance(a, torch.Tensor):
        return _checks.describe(name, a)
    a = np.asarray(a)
    kinds = {"f": "float", "i": "int", "u": "int", "b": "bool", "c": "complex"}
    kind = "float" if a.dtype.name == "bfloat16" else kinds.get(a.dtype.kind, "other")
    return ArrayInfo(tuple(a.shape), kind, a.dtype.name)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with an optional position scheme (Shaw, Huang, RoPE, ALiBi, T5, Swin;
    spec/attention.md).

    Args:
      spec: the ``AttentionSpec``.
      device, dtype: where and how the parameters are created (factory kwargs).

    Initialisation: projection weights Xavier-uniform (as ``nn.MultiheadAttention``),
    biases zero, relative tables N(0, 0.02^2).

    ``forward(query, key=None, value=None, *, mask, bias, q_positions, k_positions,
    dropout_keep, return_weights, implementation)`` has the keywords of
    ``torch_impl.attention`` (``implementation`` picks the kernel, KERN-1). In
    training mode with ``spec.dropout > 0`` and no ``dropout_keep``, the keep mask is
    drawn from the torch RNG with P(keep) = 1 - p (DROP-3); in eval mode there is no
    dropout unless a keep mask is passed.
    """

    def __init__(self, spec: AttentionSpec, device=None, dtype=None):
        super().__init__()
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
        self.spec = spec
        factory = {"device": device, "dtype": dtype}
        shapes = spec.param_shapes()  # PARAM-1, HEAD-3, HEAD-4: canonical (in, out) weights
        self.q_proj = nn.Linear(*shapes["wq"], bias=spec.bias, **factory)
        self.k_proj = nn.Linear(*shapes["wk"], bias=spec.bias, **factory)
        self.v_proj = nn.Linear(*shapes["wv"], bias=spec.bias, **factory)
        self.out_proj = nn.Linear(*shapes["wo"], bias=spec.bias, **factory)
        for name in TABLES:  # PARAM-1: a None attribute for a table the scheme does not have
            setattr(self, name, nn.Parameter(torch.empty(shapes[name], **factory)) if name in shapes else None)
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for table in (getattr(self, name) for name in TABLES):
            if table is not None:
                nn.init.normal_(table, std=0.02)

    def _linears(self):
        return {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj, "o": self.out_proj}

    def params(self) -> dict:
        """Canonical views of the parameters (no copies; autograd flows into the module)."""
        out = {}
        for n, lin in self._linears().items():
            out["w" + n] = lin.weight.T
            if lin.bias is not None:
                out["b" + n] = lin.bias
        for n in TABLES:
            if getattr(self, n) is not None:
                out[n] = getattr(self, n)
        return out

    @torch.no_grad()
    def load_canonical(self, params: dict) -> "MultiHeadAttention":
        """Copy a canonical parameter set (NumPy arrays or tensors of the module's dtype) in, exactly.

        Names and shapes are checked as at ``torch_impl.attention`` (PARAM-1, PARAM-2);
        an array of another dtype is refused, never cast (INPUT-1).
        """
        if not isinstance(params, dict):
            raise TypeError(f"params: expected a dict of arrays, got {type(params).__name__}")
        check_params(self.spec, {n: _describe(f"params[{n!r}]", a) for n, a in params.items()})
        ref = self.q_proj.weight
        for name in self.spec.param_shapes():
            t = from_numpy(params[name], ref.dtype, ref.device)
            if name in TABLES:
                getattr(self, name).copy_(t)
            else:
                lin = self._linears()[name[1]]
                (lin.weight.copy_(t.T) if name[0] == "w" else lin.bias.copy_(t))
        return self

    def canonical_params(self) -> dict:
        """The parameters in the canonical layout as NumPy arrays, exactly (PARAM-3)."""
        return {n: to_numpy(t) for n, t in self.params().items()}

    def forward(
        self,
        query,
        key=None,
        value=None,
        *,
        mask=None,
        bias=None,
        q_positions=None,
        k_positions=None,
        dropout_keep=None,
        return_weights: bool = False,
        implementation=None,
    ):
        if dropout_keep is None and self.training and self.spec.dropout > 0:
            B, Lq, _ = query.shape
            Lk = (query if key is None else key).shape[1]
            shape = (B, self.spec.num_heads, Lq, Lk)
            dropout_keep = torch.rand(shape, device=query.device) >= self.spec.dropout
        return functional.attention(
            self.spec,
            self.params(),
            query,
            key,
            value,
            mask=mask,
            bias=bias,
            q_positions=q_positions,
            k_positions=k_positions,
            dropout_keep=dropout_keep,
            return_weights=return_weights,
            implementation=implementation,
        )

    def extra_repr(self) -> str:
        return repr(self.spec)
