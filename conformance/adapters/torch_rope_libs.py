"""Three PyTorch RoPE libraries, each certified as the q/k transform of REL-3 (1) inside the RoPE glue.

- ``rotary-embedding-torch``: ``rotary_embedding_torch.RotaryEmbedding(dim=r, theta=...)``
  (or ``custom_freqs=``); contiguous positions of one row go through its
  ``rotate_queries_or_keys(t, offset=p0)`` (it builds the positions itself),
  any others through its frequency call on a positions tensor and
  ``apply_rotary_emb``.
- ``torchtune-rope``: ``torchtune.modules.RotaryPositionalEmbeddings(dim=d,
  max_seq_len, base)`` called on (B, L, H, d) with ``input_pos``.
- ``xt-rope``: x-transformers' ``RotaryEmbedding(dim=r, base=...)`` on a
  positions tensor and its ``apply_rotary_pos_emb``.

All three pair channels (2c, 2c + 1) (ROPE-3, the interleaved layout) and
have no half layout: a half-layout case reaches them the way a checkpoint in
that layout reaches such a library, with the q/k channels of each head
permuted by ``spec.rope_permutation`` (ROPE-8) before the rotation and back
after it (an exact reordering: it adds no arithmetic). Each module is built
in float32 (the dtype the libraries make their frequencies in) and cast with
``.to(dtype)``, as a user runs a model in another dtype; explicit
frequencies (``Rope.inv_freq``, ROPE-4) go into the library's own frequency
tensor in float32 before that cast (rotary-embedding-torch's
``custom_freqs``, x-transformers' ``inv_freq`` buffer overwritten), as a user
loads scaled ones. Only the cases with a Rope run (``Capabilities.requires``):
without one the glue alone would be checked.
The attention factor (ROPE-7) is the ``scale`` argument of
rotary-embedding-torch's and x-transformers' rotation (it multiplies the
rotated channels only, which is ROPE-7 exactly); torchtune has none.

Axis legend (AXES-1): B, H, Lq, Lk, d; r rotated channels.
"""

from __future__ import annotations

import importlib
from typing import ClassVar

import numpy as np

from . import _glue, _torch
from .base import Capabilities

#: Why a case that is not RoPE is not run (the glue certifies a rotation, nothing else).
NOT_ROPE = "only the rotary embedding (REL-3 q/k transform) is certified"
NOT_ROPE_NOTES = {
    "shaw": NOT_ROPE,
    "shaw-values": NOT_ROPE,
    "huang": NOT_ROPE,
    "per-head-tables": NOT_ROPE,
    "unscaled-relative": NOT_ROPE,
    "softcap": "the glue's core has no soft cap (SOFTCAP-1)",
    "window": "the glue's core has no window (WINDOW-1)",
    "mask-fill": "the glue's core gives disallowed keys weight 0 (MASK-5), no fill value",
    "validates-input": "the library's rotation is not an attention entry point (INPUT-1)",
}


def _contiguous(p: np.ndarray) -> bool:
    """One row of consecutive positions p0, p0 + 1, ... (what an offset can express)."""
    return p.shape[0] == 1 and bool(np.all(np.diff(p[0]) == 1))


class _RopeLibraryAdapter(_torch.TorchAdapter):
    """A library's rotation inside the glue; subclasses build ``rotate(x, positions)`` from the library."""

    module: ClassVar[str]  # the import that must succeed
    distribution: ClassVar[str]  # the pip requirement that provides it
    rope_features: ClassVar[frozenset] = frozenset({"rope", "rope-interleaved"})
    rope_notes: ClassVar[dict] = {}

    def unavailable(self):
        reason = _torch.torch_available()
        if reason:
            return reason
        try:
            importlib.import_module(self.module)
        except Exception as e:  # ImportError, or a dependency of it that fails at import
            return f"{self.module} cannot be imported ({type(e).__name__}: {e}); pip install {self.distribution}"
        return None

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=_glue.GLUE_FEATURES | self.rope_features,
            notes={**NOT_ROPE_NOTES, **self.rope_notes},
            requires=_glue.ROPE_ONLY,
        )

    def environment(self):
        from importlib import metadata

        return {**_torch.pin_numerics(), self.distribution: metadata.version(self.distribution)}

    # ------------------------------------------------------------------ rotation
    def library_rotate(self, rope, d: int, dtype, device: str):
        """``rotate(x, positions)`` of the library for x (B, heads, L, d) in the interleaved layout."""
        raise NotImplementedError

    def rotation(self, spec, dtype, device: str):
        """The glue's ``rotate``: the library's, with the half layout mapped in and out (ROPE-8)."""
        rope, d = spec.relative, spec.head_dim
        rotate = self.library_rotate(rope, d, dtype, device)
        if rope.layout == "interleaved":
            return rotate
        import torch

        to_interleaved, to_half = (torch.from_numpy(p).to(device) for p in _glue.interleaved_orders(rope, d))
        return lambda x, positions: rotate(x[..., to_interleaved], positions)[..., to_half]

    def _run(self, spec, params, inputs, device, need_weights, grad_out=None):
        dtype = _torch.dtype_of(np.asarray(inputs["query"]))
        rotate = self.rotation(spec, dtype, device)
        return _glue.torch_run(spec, params, inputs, device, rotate, need_weights=need_weights, grad_out=grad_out)

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        with torch.no_grad():
            return self._run(spec, params, inputs, device, need_weights)

    def vjp(self, spec, params, inputs, grad_out, *, device):
        return self._run(spec, params, inputs, device, False, grad_out=grad_out)


def _float32_frequencies(rope, d: int):
    import torch

    return torch.tensor(rope.frequencies(d), dtype=torch.float32)


# ---------------------------------------------------------------- rotary-embedding-torch
class RotaryEmbeddingTorchAdapter(_RopeLibraryAdapter):
    name = "rotary-embedding-torch"
    description = "rotary_embedding_torch.RotaryEmbedding (rotate_queries_or_keys / apply_rotary_emb) in the RoPE glue"
    module = "rotary_embedding_torch"
    distribution = "rotary-embedding-torch"
    rope_features = frozenset({"rope", "rope-interleaved", "rope-partial", "rope-attention-factor"})

    def library_rotate(self, rope, d, dtype, device):
        import torch
        from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb

        r, af = rope.rotated(d), rope.attention_factor
        custom = None if rope.inv_freq is None else _float32_frequencies(rope, d)
        module = RotaryEmbedding(dim=r, theta=rope.theta, custom_freqs=custom).to(device=device, dtype=dtype)

        def rotate(x, positions):  # x (B, heads, L, d): the default seq_dim -2
            if _contiguous(positions):  # the library makes the positions: arange(L, dtype=x.dtype) + offset
                return module.rotate_queries_or_keys(x, offset=int(positions[0, 0]), scale=af)
            freqs = module(torch.from_numpy(positions).to(device))  # (1|B, L, r)
            return apply_rotary_emb(freqs[:, None], x, scale=af)  # (1|B, 1, L, r) against (B, heads, L, d)

        return rotate


# ------------------------------------------------------------------------- torchtune
class TorchtuneRopeAdapter(_RopeLibraryAdapter):
    name = "torchtune-rope"
    description = "torchtune.modules.RotaryPositionalEmbeddings with input_pos in the RoPE glue"
    module = "torchtune.modules"
    distribution = "torchtune"
    rope_features = frozenset({"rope", "rope-interleaved"})
    rope_notes = {
        "rope-partial": "RotaryPositionalEmbeddings rotates the whole head (its dim is the head size) with "
        "frequencies base ** (-2c / dim): no r < d (ROPE-2); explicit frequencies only by its "
        "subclasses (Llama3ScaledRoPE)",
        "rope-attention-factor": "RotaryPositionalEmbeddings has no attention factor (ROPE-7)",
    }
    #: the library's default cache length; the adapter extends it when positions go further (a user sets it)
    DEFAULT_MAX_SEQ_LEN = 4096

    def library_rotate(self, rope, d, dtype, device):
        import torch
        from torchtune.modules import RotaryPositionalEmbeddings

        def rotate(x, positions):  # x (B, heads, L, d); the library takes (B, L, heads, d)
            length = max(self.DEFAULT_MAX_SEQ_LEN, int(positions.max()) + 1)
            module = RotaryPositionalEmbeddings(dim=d, max_seq_len=length, base=rope.theta).to(
                device=device, dtype=dtype
            )
            input_pos = torch.from_numpy(positions).to(device)  # (1|B, L) int64
            return module(x.transpose(1, 2), input_pos=input_pos).transpose(1, 2)

        return rotate


# ------------------------------------------------------------------- x-transformers
class XTransformersRopeAdapter(_RopeLibraryAdapter):
    name = "xt-rope"
    description = "x_transformers RotaryEmbedding + apply_rotary_pos_emb in the RoPE glue"
    module = "x_transformers.x_transformers"
    distribution = "x-transformers"
    rope_features = frozenset({"rope", "rope-interleaved", "rope-partial", "rope-attention-factor"})

    def library_rotate(self, rope, d, dtype, device):
        import torch
        from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb

        r, af = rope.rotated(d), rope.attention_factor
        module = RotaryEmbedding(dim=r, base=rope.theta)
        if rope.inv_freq is not None:
            with torch.no_grad():
                module.inv_freq.copy_(_float32_frequencies(rope, d))  # its persistent float32 buffer
        module = module.to(device=device, dtype=dtype)

        def rotate(x, positions):  # x (B, heads, L, d)
            freqs, xpos_scale = module(torch.from_numpy(positions).to(device))  # (1|B, L, r), 1.0 without xpos
            return apply_rotary_pos_emb(x, freqs, af * xpos_scale)

        return rotate
