"""timm's Swin ``WindowAttention`` as a whole layer on one window, canonical weights and table loaded (SWIN-1..5).

``WindowAttention(dim=D, num_heads=H, head_dim=d, window_size=(Wh, Ww),
qkv_bias)`` is built in float32, cast with ``.to(dtype)`` and loaded: its
packed ``qkv`` linear holds ``[wq.T; wk.T; wv.T]`` (rows q, then k, then v;
within each, head-major as HEAD-1 splits), ``proj`` holds ``wo.T`` and
``bo``, and its ``relative_position_bias_table`` ((2Wh-1)(2Ww-1), H) holds
``rel_b`` reversed along R and transposed, as Hugging Face's (SWIN-3). timm
runs its explicit path (``fused_attn`` is off for this layer by default):
``q * scale``, the table's bias, the window mask (one (N, N) per window,
the ``bias`` input of the cases), a softmax in the input dtype.

The packed ``qkv`` reads one input, so for the partials with respect to
query, key and value a forward hook recomputes its output from three inputs
with its own weight and bias (``x_q Wq^T + bq``, ``x_k Wk^T + bk``,
``x_v Wv^T + bv``; in a forward call all three are the query).

timm imports torchvision, whose PyPI build that matches the pinned PyTorch
(0.28 for 2.13) does not import beside PyTorch's CPU build; ``.ci/run``
certifies timm in an environment of its own, the ``timm`` extra (torch
2.14.1, torchvision 0.29.1, timm 1.0.31).
"""

from __future__ import annotations

import contextlib

from . import _torch
from .hf_bias_layers import SwinWindowLayer

TIMM_INSTALL = 'pip install -e ".[conformance,timm]" (torch 2.14.1, torchvision 0.29.1, timm 1.0.31)'


class TimmWindowAttentionAdapter(SwinWindowLayer):
    name = "timm-window-attention"
    description = "timm WindowAttention (Swin) on one window, canonical weights and table loaded"
    layer_name = "WindowAttention"
    returns_weights = False  # forward returns the output only
    table = "relative_position_bias_table"

    def unavailable(self):
        missing = _torch.torch_available()
        if missing:
            return missing
        try:
            import timm.models.swin_transformer  # noqa: F401
        except Exception as e:  # an ImportError, or torchvision's RuntimeError beside a mismatched torch
            return f"timm cannot be imported ({type(e).__name__}: {e}); in an environment of its own: {TIMM_INSTALL}"
        return None

    def environment(self):
        import timm
        import torchvision

        return {**_torch.pin_numerics(), "timm": timm.__version__, "torchvision": torchvision.__version__}

    def build(self, spec, dtype, device):
        from timm.models.swin_transformer import WindowAttention

        m = WindowAttention(
            spec.model_dim,
            spec.num_heads,
            head_dim=spec.head_dim,
            window_size=spec.relative.window,
            qkv_bias=spec.bias,
        )
        return m.to(device=device, dtype=_torch.torch_dtype(dtype)).eval()

    def load_weights(self, m, params, device):
        import torch

        with torch.no_grad():
            m.qkv.weight.copy_(torch.cat([_torch.to_torch(params[w], device).T for w in ("wq", "wk", "wv")]))
            if m.qkv.bias is not None:
                m.qkv.bias.copy_(torch.cat([_torch.to_torch(params[b], device) for b in ("bq", "bk", "bv")]))
            m.proj.weight.copy_(_torch.to_torch(params["wo"], device).T)
            m.proj.bias.copy_(_torch.to_torch(params["bo"], device))
        return m

    def _split(self, m, tensors) -> dict:
        """{wq, wk, wv[, bq, bk, bv], wo, bo} of the packed qkv and proj (weights or their gradients)."""
        qkv_w, qkv_b, proj_w, proj_b = tensors
        out = {w: _torch.to_numpy(part.T.contiguous()) for w, part in zip(("wq", "wk", "wv"), qkv_w.chunk(3))}
        if qkv_b is not None:
            out.update({b: _torch.to_numpy(part) for b, part in zip(("bq", "bk", "bv"), qkv_b.chunk(3))})
        out["wo"], out["bo"] = _torch.to_numpy(proj_w.T.contiguous()), _torch.to_numpy(proj_b)
        return out

    def canonical_weights(self, m):
        return self._split(m, (m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias))

    def weight_gradients(self, m):
        bias = None if m.qkv.bias is None else m.qkv.bias.grad
        return self._split(m, (m.qkv.weight.grad, bias, m.proj.weight.grad, m.proj.bias.grad))

    @contextlib.contextmanager
    def own_inputs(self, m, t):
        import torch

        def three_inputs(module, args, output):
            W = module.weight.chunk(3)
            b = (None, None, None) if module.bias is None else module.bias.chunk(3)
            key = t.get("key", t["query"])
            inputs = (t["query"], key, t.get("value", key))
            parts = [torch.nn.functional.linear(x, w, c) for x, w, c in zip(inputs, W, b)]
            return torch.cat(parts, dim=-1)

        hook = m.qkv.register_forward_hook(three_inputs)
        try:
            yield
        finally:
            hook.remove()

    def call(self, spec, m, t, inputs, *, training):
        return m(t["query"], mask=self.window_mask(t)), None
