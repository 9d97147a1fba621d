"""``torch.nn.MultiheadAttention`` (batch_first), loaded with the canonical parameters.

Mapping (spec/comparison.md): ``in_proj_weight`` stacks wq.T, wk.T, wv.T
(PyTorch stores (out, in)); ``out_proj.weight`` is wo.T; the one copy of
that map is ``torch_impl.interop`` (``to_torch_mha``, ``canonical_of``). Its boolean masks
are True = *not allowed*, so the adapter passes the inverted allowed mask as
``attn_mask`` of shape (B*H, Lq, Lk); a bias goes in as a float attn_mask.
"""

from __future__ import annotations

import numpy as np

from . import _torch
from .base import Capabilities


def to_module(spec, params: dict, device: str):
    """The module holding the canonical parameters (in their dtype), in eval mode: torch_impl's layout map."""
    import torch_impl

    return torch_impl.to_torch_mha(spec, params, device=device).eval()


def from_module(spec, m) -> dict:
    from torch_impl import interop

    return interop.canonical_of(m)


def grads_of(spec, m) -> dict:
    from torch_impl import interop

    return interop.canonical_of(m, grad=True)


#: The peer options of AttentionSpec the layer lacks (the same reasons as torch_impl.interop.MHA_LACKS,
#: written out so that the capabilities need no torch import).
PEER_NOTES = {
    "grouped-kv-heads": "nn.MultiheadAttention has no grouped key/value heads (HEAD-3)",
    "value-head-dim": "nn.MultiheadAttention has no value head size of its own (HEAD-4)",
    "softcap": "nn.MultiheadAttention has no logit soft-capping (SOFTCAP-1)",
    "window": "nn.MultiheadAttention has no window on the distance (WINDOW-1; to_torch_mha refuses spec.window)",
}


class TorchMHAAdapter(_torch.TorchAdapter):
    name = "torch-mha"
    description = "torch.nn.MultiheadAttention(batch_first=True) with the canonical parameters"

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset({"cross-attention", "no-projection-bias", "causal", "mask", "bias", "dropout-spec"}),
            notes={
                "custom-scale": "the scale is fixed at 1/sqrt(head_dim)",
                "positions": "no position input",
                "shaw": "no relative positions",
                "huang": "no relative positions",
                "mask-fill": "masked logits are -inf",
                "dropout-keep": "dropout uses its own RNG",
                **PEER_NOTES,
            },
        )

    def _run(self, spec, m, inputs, device, leaves):
        import torch

        x = leaves["query"]
        key = leaves.get("key", x)
        value = leaves.get("value", key)
        B, Lq, _ = x.shape
        Lk, H = key.shape[1], spec.num_heads
        allowed = _torch.allowed_mask(spec, inputs, B, H, Lq, Lk, device)
        bias = leaves.get("bias")
        if bias is not None:
            attn_mask = torch.broadcast_to(bias, (B, H, Lq, Lk)).masked_fill(~allowed, float("-inf"))
        else:
            attn_mask = ~allowed  # True = not allowed
        attn_mask = attn_mask.reshape(B * H, Lq, Lk)
        return m(x, key, value, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        m = to_module(spec, params, device)
        leaves = {n: _torch.to_torch(inputs[n], device) for n in ("query", "key", "value", "bias") if n in inputs}
        with torch.no_grad():
            out, w = self._run(spec, m, inputs, device, leaves)
        result = {"out": _torch.to_numpy(out)}
        if need_weights:
            result["weights"] = _torch.to_numpy(w)
        return result

    def vjp(self, spec, params, inputs, grad_out, *, device):
        m = to_module(spec, params, device)
        leaves = {
            n: _torch.to_torch(inputs[n], device, requires_grad=True)
            for n in ("query", "key", "value", "bias")
            if n in inputs
        }
        out, _ = self._run(spec, m, inputs, device, leaves)
        out.backward(_torch.to_torch(grad_out, device))
        grads = {n: _torch.to_numpy(leaf.grad) for n, leaf in leaves.items()}
        grads.update(grads_of(spec, m))
        return {n: np.asarray(g) for n, g in grads.items()}

    def roundtrip_params(self, spec, params):
        m = to_module(spec, params, "cpu")
        return from_module(spec, m)
