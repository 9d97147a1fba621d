"""Hugging Face transformers' RoPE: Llama's, GPT-NeoX's and GPT-J's rotations, and one whole LlamaAttention.

Four adapters, each built from a config with random weights (nothing is
downloaded), in the case's dtype the way a user gets there: the module is
built in float32 and cast with ``.to(dtype)`` (float64 included), so what
that cast does to the library's frequency buffers is part of what is
certified.

- ``hf-llama-rope``: ``LlamaRotaryEmbedding`` and Llama's
  ``apply_rotary_pos_emb`` as the q/k transform of the RoPE glue
  (``_glue``). Half layout. r < d goes in as the config's
  ``partial_rotary_factor = r / d``, as a user writes it; explicit
  frequencies overwrite the module's float32 ``inv_freq`` buffer (how a user
  loads scaled frequencies); the attention factor is the module's
  ``attention_scaling``.
- ``hf-gptneox-rope``: ``GPTNeoXRotaryEmbedding`` (``rotary_pct = r / d``,
  ``rotary_emb_base = theta``) and GPT-NeoX's ``apply_rotary_pos_emb``, which
  rotates the first ``cos.shape[-1]`` channels, in the glue.
- ``hf-gptj-rope``: GPT-J's interleaved rotation (``rotary_dim``,
  ``GPTJRotaryEmbedding``'s sin/cos table from ``create_sinusoidal_positions``,
  ``apply_rotary_pos_emb`` / ``rotate_every_two`` on the first ``rotary_dim``
  channels, as ``GPTJAttention`` splits them) in the glue. GPT-J's base is
  fixed at 10000: another ``theta`` or explicit frequencies rebuild the table
  with GPT-J's own arithmetic (float32 positions times float32 frequencies,
  ``cat(sin, cos)``), the frequency buffer GPT-J keeps being that table. The
  half layout goes through ROPE-8: the channels are permuted to the
  interleaved order before the rotation and back after it, which is the
  permutation of the q/k weight columns (exact).
- ``hf-llama-attention``: one ``LlamaAttention`` layer (eager attention), the
  canonical weights loaded into q_proj/k_proj/v_proj/o_proj (canonical (in,
  out), ``nn.Linear`` (out, in)), called with ``position_embeddings`` from
  ``LlamaRotaryEmbedding`` at ``arange(L)`` and an additive 4-D
  ``attention_mask`` made the way HF's mask utilities make it: 0 where a key
  is allowed (the bias there, when given), ``torch.finfo(dtype).min``
  elsewhere. The layer is self-attention with one position per token: no
  cross-attention and no q_positions != k_positions (a cache prefill would
  make the new queries' own keys part of the keys, and one ``position_ids``
  turns both q and k). Its gradients with respect to query, key and value are
  the three partials: forward pre-hooks hand q_proj, k_proj and v_proj each
  its own (equal-valued) input tensor.

The glue adapters run only the cases with a Rope (``Capabilities.requires``):
elsewhere they would check the glue alone. LlamaAttention runs the others
too, with cos = 1, sin = 0: those cells check HF's eager attention core.

Axis legend (AXES-1): B, H, Lq, Lk, D, d; Hkv key/value heads; r rotated channels.
"""

from __future__ import annotations

import importlib

import numpy as np

from . import _glue, _hf_layers, _torch
from .base import Capabilities

#: The release these adapters were certified against (the pin of the extra).
TRANSFORMERS_PIN = "transformers==5.24.0"
#: The length GPT-J's sin/cos table has at least (GPTJConfig's max_position_embeddings).
GPTJ_MIN_TABLE = 2048


def transformers_unavailable(major=None):
    """Why transformers cannot run an adapter here, or None; with ``major``, an adapter certified against that
    major release only (its code paths and its deviations are that release's) is unavailable on another one."""
    missing = _torch.torch_available()
    if missing:
        return missing
    try:
        import transformers
    except ImportError as e:
        return f"transformers is not installed ({e}); pip install {TRANSFORMERS_PIN}"
    if major is not None and int(transformers.__version__.split(".")[0]) != major:
        return (
            f"certified against transformers {major}.x (the rope extra pins {TRANSFORMERS_PIN}); this environment "
            f"has {transformers.__version__}: pip install {TRANSFORMERS_PIN}"
        )
    return None


def _rope(spec):
    return spec.relative if getattr(spec.relative, "name", None) == "rope" else None  # REL-3: by name


def _load_frequencies(module, name: str, frequencies) -> None:
    """Overwrite the module's frequency buffer with ``frequencies`` in the dtype the module keeps it in."""
    import torch

    old = getattr(module, name)
    setattr(module, name, torch.tensor(np.asarray(frequencies, dtype=np.float64), dtype=old.dtype, device=old.device))


def llama_config(spec, rope):
    """LlamaConfig of the spec: sizes, bias, theta, r as ``partial_rotary_factor`` when r < d."""
    from transformers import LlamaConfig

    d = spec.head_dim
    parameters = {"rope_type": "default", "rope_theta": 10000.0 if rope is None else rope.theta}
    if rope is not None and rope.rotated(d) != d:
        parameters["partial_rotary_factor"] = rope.rotated(d) / d
    return LlamaConfig(
        hidden_size=spec.model_dim,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=d,
        attention_bias=spec.bias,
        attention_dropout=0.0,
        rope_parameters=parameters,
        attn_implementation="eager",
    )


def llama_rotary(spec, dtype: str, device: str):
    """LlamaRotaryEmbedding of ``spec.relative`` (a Rope), built in float32 and cast to ``dtype``."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = _rope(spec)
    emb = LlamaRotaryEmbedding(llama_config(spec, rope))
    if rope.inv_freq is not None:
        _load_frequencies(emb, "inv_freq", rope.inv_freq)
        _load_frequencies(emb, "original_inv_freq", rope.inv_freq)
    emb.attention_scaling = rope.attention_factor  # ROPE-7: HF multiplies cos and sin by it
    return emb.to(device=device, dtype=_torch.torch_dtype(dtype))


def gptneox_rotary(spec, dtype: str, device: str):
    """GPTNeoXRotaryEmbedding with ``rotary_pct = r / d`` and ``rotary_emb_base = theta``."""
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

    rope = _rope(spec)
    d = spec.head_dim
    r = rope.rotated(d)
    config = GPTNeoXConfig(
        hidden_size=spec.num_heads * d,
        num_attention_heads=spec.num_heads,
        rotary_pct=r / d,
        rotary_emb_base=rope.theta,
    )
    if int(d * config.rope_parameters["partial_rotary_factor"]) != r:  # int(d * pct) is what GPT-NeoX rotates
        raise ValueError(f"rotary_dim: GPT-NeoX cannot express r = {r} of head_dim {d} as rotary_pct = r / d")
    emb = GPTNeoXRotaryEmbedding(config)
    if rope.inv_freq is not None:
        _load_frequencies(emb, "inv_freq", rope.inv_freq)
        _load_frequencies(emb, "original_inv_freq", rope.inv_freq)
    emb.attention_scaling = rope.attention_factor
    return emb.to(device=device, dtype=_torch.torch_dtype(dtype))


def gptj_table(num_positions: int, frequencies) -> "object":
    """GPT-J's sin/cos table (``create_sinusoidal_positions``' arithmetic) for any float32 frequencies."""
    import torch

    inv_freq = torch.tensor(np.asarray(frequencies, dtype=np.float64), dtype=torch.float32)
    sinusoid = torch.arange(num_positions, dtype=torch.int64).float()[:, None] * inv_freq
    return torch.cat((torch.sin(sinusoid), torch.cos(sinusoid)), dim=1)


def gptj_rotary(spec, dtype: str, device: str, num_positions: int):
    """GPTJRotaryEmbedding with ``rotary_dim = r``; its table rebuilt when theta != 10000 or inv_freq is given."""
    from transformers import GPTJConfig
    from transformers.models.gptj.modeling_gptj import GPTJRotaryEmbedding

    rope = _rope(spec)
    r = rope.rotated(spec.head_dim)
    config = GPTJConfig(
        n_embd=spec.num_heads * spec.head_dim,
        n_head=spec.num_heads,
        rotary_dim=r,
        n_positions=num_positions,
    )
    emb = GPTJRotaryEmbedding(config)
    if rope.inv_freq is not None or rope.theta != 10000.0:
        emb.embed_positions = gptj_table(num_positions, rope.frequencies(spec.head_dim))
    return emb.to(device=device, dtype=_torch.torch_dtype(dtype))


# --------------------------------------------------------------------- glue adapters
class _GlueAdapter(_torch.TorchAdapter):
    """An HF rotation inside the RoPE glue; subclasses build ``rotation(spec, dtype, device)``."""

    layouts: tuple = ("half",)
    attention_factor: bool = True
    notes: dict = {}

    def __init__(self):
        self._cache: dict = {}

    def unavailable(self):
        return transformers_unavailable(major=5)

    def capabilities(self):
        f = set(_glue.GLUE_FEATURES) | {"rope", "rope-partial"}
        if "interleaved" in self.layouts:
            f.add("rope-interleaved")
        if self.attention_factor:
            f.add("rope-attention-factor")
        notes = {
            "shaw": "a RoPE library: no relative tables",
            "huang": "a RoPE library: no relative tables",
            **self.notes,
        }
        return Capabilities(devices=_torch.devices(), features=frozenset(f), notes=notes, requires=_glue.ROPE_ONLY)

    def environment(self):
        import transformers

        return {**_torch.pin_numerics(), "transformers": transformers.__version__}

    def release(self):
        self._cache.clear()

    def rotation(self, spec, dtype: str, device: str):
        """rotate(x (B, heads, L, d), positions (1|B, L) int64) -> x rotated, in x's dtype."""
        raise NotImplementedError

    def _rotate(self, spec, dtype: str, device: str):
        key = (spec.relative, spec.head_dim, spec.num_heads, dtype, device)
        if key not in self._cache:
            self._cache[key] = self.rotation(spec, dtype, device)
        return self._cache[key]

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        rotate = self._rotate(spec, inputs["query"].dtype.name, device)
        with torch.no_grad():
            return _glue.torch_run(spec, params, inputs, device, rotate, need_weights=need_weights)

    def vjp(self, spec, params, inputs, grad_out, *, device):
        rotate = self._rotate(spec, inputs["query"].dtype.name, device)
        return _glue.torch_run(spec, params, inputs, device, rotate, need_weights=False, grad_out=grad_out)


class _RotateHalfAdapter(_GlueAdapter):
    """A model's rotary embedding module and its ``apply_rotary_pos_emb`` (rotate_half) in the glue."""

    model_module: str = ""  # the transformers module that defines apply_rotary_pos_emb

    def embedding(self, spec, dtype, device):
        """The model's rotary embedding module: ``emb(x, position_ids) -> (cos, sin)``."""
        raise NotImplementedError

    def rotation(self, spec, dtype, device):
        apply_rotary_pos_emb = importlib.import_module(self.model_module).apply_rotary_pos_emb
        emb = self.embedding(spec, dtype, device)

        def rotate(x, positions):
            cos, sin = emb(x, _torch.to_torch(positions, x.device))  # (1|B, L, rotated channels)
            return apply_rotary_pos_emb(x, x, cos, sin)[0]

        return rotate


class HFLlamaRopeAdapter(_RotateHalfAdapter):
    name = "hf-llama-rope"
    description = "transformers LlamaRotaryEmbedding + apply_rotary_pos_emb (Llama) in the RoPE glue"
    notes = {"rope-interleaved": "Llama's rotate_half pairs channel c with c + d/2 only (ROPE-3)"}
    model_module = "transformers.models.llama.modeling_llama"

    def embedding(self, spec, dtype, device):
        return llama_rotary(spec, dtype, device)


class HFGPTNeoXRopeAdapter(_RotateHalfAdapter):
    name = "hf-gptneox-rope"
    description = "transformers GPTNeoXRotaryEmbedding + apply_rotary_pos_emb (GPT-NeoX, partial) in the RoPE glue"
    notes = {"rope-interleaved": "GPT-NeoX's rotate_half pairs channel c with c + r/2 only (ROPE-3)"}
    model_module = "transformers.models.gpt_neox.modeling_gpt_neox"

    def embedding(self, spec, dtype, device):
        return gptneox_rotary(spec, dtype, device)


class HFGPTJRopeAdapter(_GlueAdapter):
    name = "hf-gptj-rope"
    description = "transformers GPT-J rotary (create_sinusoidal_positions, rotate_every_two) in the RoPE glue"
    layouts = ("half", "interleaved")
    attention_factor = False
    notes = {"rope-attention-factor": "GPT-J's rotary has no attention factor (ROPE-7)"}

    def _rotate(self, spec, dtype, device):
        return lambda x, positions: self._gptj(spec, dtype, device, x, positions)

    def _gptj(self, spec, dtype, device, x, positions):
        import torch
        from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

        rope = _rope(spec)
        d = spec.head_dim
        r = rope.rotated(d)
        # the table holds rows 0 .. N-1 and is indexed by the positions (as GPT-J does, negative ones included)
        size = max(GPTJ_MIN_TABLE, 1 << int(np.max(positions, initial=0) + 1).bit_length())
        key = (spec.relative, d, spec.num_heads, dtype, device, size)
        if key not in self._cache:
            self._cache[key] = gptj_rotary(spec, dtype, device, size)
        emb = self._cache[key]
        half = rope.layout == "half"
        if half:  # ROPE-8: into the interleaved layout GPT-J has, and back after the rotation
            to_interleaved, to_half = (torch.from_numpy(o).to(x.device) for o in _glue.interleaved_orders(rope, d))
            x = x[..., to_interleaved]
        y = x.transpose(1, 2)  # (B, L, heads, d), GPT-J's layout before its transpose
        sin, cos = emb(y, _torch.to_torch(positions, x.device))  # (1|B, L, r/2) each
        rotated = apply_rotary_pos_emb(y[..., :r], sin, cos)
        y = torch.cat([rotated, y[..., r:]], dim=-1).transpose(1, 2)  # (B, heads, L, d)
        return y[..., to_half] if half else y


# ----------------------------------------------------------------- LlamaAttention
class HFLlamaAttentionAdapter(_torch.TorchAdapter):
    name = "hf-llama-attention"
    description = "transformers LlamaAttention (eager) + LlamaRotaryEmbedding, canonical weights loaded"

    def unavailable(self):
        return transformers_unavailable(major=5)

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset(
                {
                    "rope",
                    "rope-partial",
                    "rope-attention-factor",
                    "no-projection-bias",
                    "causal",
                    "mask",
                    "bias",
                    "grouped-kv-heads",
                }
            ),
            notes={
                "cross-attention": "LlamaAttention is self-attention: q, k and v come from one hidden_states "
                "(a cache prefill makes the new queries' own keys part of the keys)",
                "positions": "one position_ids per token turns both its query and its key, so q_positions and "
                "k_positions cannot differ; the layer runs at arange(L)",
                "custom-scale": "LlamaAttention's scaling is head_dim ** -0.5",
                "value-head-dim": "v_proj has num_key_value_heads * head_dim outputs (HEAD-4)",
                "dropout-keep": "attention dropout draws from torch's RNG in training mode",
                "dropout-spec": "attention dropout draws from torch's RNG in training mode",
                "mask-fill": "masked logits get torch.finfo(dtype).min added",
                "rope-interleaved": "Llama's rotate_half pairs channel c with c + d/2 only (ROPE-3)",
                "shaw": "no relative tables",
                "huang": "no relative tables",
                "softcap": "LlamaAttention has no logit soft-capping",
                "window": "LlamaAttention has no sliding window",
            },
        )

    def environment(self):
        import transformers

        return {**_torch.pin_numerics(), "transformers": transformers.__version__}

    def layer(self, spec, params: dict, device: str):
        """LlamaAttention built in float32, cast to the parameters' dtype, then the canonical weights loaded."""
        from transformers.models.llama.modeling_llama import LlamaAttention

        dtype = _torch.torch_dtype(params["wq"].dtype.name)
        m = LlamaAttention(llama_config(spec, _rope(spec)), layer_idx=0).to(device=device, dtype=dtype).eval()
        return _hf_layers.load(m, params, device)

    def roundtrip_params(self, spec, params):
        return _hf_layers.canonical(self.layer(spec, params, "cpu"))

    def _position_embeddings(self, spec, x):
        """(cos, sin) (1, L, d) at arange(L) from LlamaRotaryEmbedding; cos = 1, sin = 0 without a Rope."""
        import torch

        L, d = x.shape[1], spec.head_dim
        if _rope(spec) is None:
            return torch.ones((1, L, d), dtype=x.dtype, device=x.device), torch.zeros(
                (1, L, d), dtype=x.dtype, device=x.device
            )
        emb = llama_rotary(spec, str(x.dtype).removeprefix("torch."), str(x.device))
        return emb(x, torch.arange(L, device=x.device)[None])

    def _attention_mask(self, spec, inputs, bias, x, H):
        """The additive (B, H, L, L) mask: 0 (or the bias) where allowed, finfo(dtype).min elsewhere (None: none)."""
        import torch

        B, L = x.shape[0], x.shape[1]
        if not spec.causal and inputs.get("mask") is None:
            return bias
        allowed = _torch.allowed_mask(spec, inputs, B, H, L, L, str(x.device))  # top-left causal = arange positions
        base = torch.zeros((B, H, L, L), dtype=x.dtype, device=x.device) if bias is None else bias.expand(B, H, L, L)
        return base.masked_fill(~allowed, torch.finfo(x.dtype).min)

    def _check(self, inputs):
        for name in ("q_positions", "k_positions", "dropout_keep"):
            if inputs.get(name) is not None:
                raise ValueError(f"{name}: hf-llama-attention takes none (see its capabilities), got an array")

    def _call(self, spec, m, t, inputs, *, split_inputs: bool):
        x = t["query"]
        leaves = {"k_proj": t["key"], "v_proj": t["value"]} if split_inputs else {}
        with _hf_layers.own_inputs(m, leaves):  # each projection its own leaf: the partials for query, key, value
            mask = self._attention_mask(spec, inputs, t.get("bias"), x, spec.num_heads)
            return m(x, position_embeddings=self._position_embeddings(spec, x), attention_mask=mask)

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        self._check(inputs)
        m = self.layer(spec, params, device)
        t = {n: _torch.to_torch(inputs[n], device) for n in ("query", "bias") if inputs.get(n) is not None}
        with torch.no_grad():
            out, weights = self._call(spec, m, t, inputs, split_inputs=False)
        res = {"out": _torch.to_numpy(out)}
        if need_weights:
            res["weights"] = _torch.to_numpy(weights)
        return res

    def vjp(self, spec, params, inputs, grad_out, *, device):
        import torch

        self._check(inputs)
        m = self.layer(spec, params, device)
        for p in m.parameters():
            p.requires_grad_(True)
        names = [n for n in ("query", "key", "value", "bias") if inputs.get(n) is not None]
        t = {n: _torch.to_torch(inputs[n], device, requires_grad=True) for n in names}
        out, _ = self._call(spec, m, t, inputs, split_inputs=True)
        out.backward(_torch.to_torch(grad_out, device))
        grads = {n: _torch.to_numpy(t[n].grad if t[n].grad is not None else torch.zeros_like(t[n])) for n in names}
        return {**grads, **_hf_layers.gradients(m)}
