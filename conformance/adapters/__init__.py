"""Adapter registry: built-in adapters, entry points, and ``module:Class`` specs.

Outside adapters plug in either by ``--adapter my_package.my_module:MyAdapter``
or by an entry point in the group ``attnspec.adapters`` (name -> class).
"""

from __future__ import annotations

import importlib
from importlib import metadata

from .base import Adapter, Capabilities

ENTRY_POINT_GROUP = "attnspec.adapters"

BUILTIN = {
    "numpy": "conformance.adapters.numpy_ref_adapter:NumpyRefAdapter",
    "numpy:blockwise": "conformance.adapters.numpy_ref_adapter:NumpyBlockwiseAdapter",
    "torch": "conformance.adapters.torch_impl_adapter:TorchImplAdapter",
    "torch:eager": "conformance.adapters.torch_impl_adapter:TorchEagerAdapter",
    "torch:sdpa": "conformance.adapters.torch_impl_adapter:TorchSDPAKernelAdapter",
    "torch:tiles": "conformance.adapters.torch_impl_adapter:TorchTilesAdapter",
    "torch:flex": "conformance.adapters.torch_impl_adapter:TorchFlexAdapter",
    "torch:triton": "conformance.adapters.torch_impl_adapter:TorchTritonAdapter",
    "jax": "conformance.adapters.jax_impl_adapter:JaxImplAdapter",
    "jax:xla": "conformance.adapters.jax_impl_adapter:JaxXlaAdapter",
    "jax:tiles": "conformance.adapters.jax_impl_adapter:JaxTilesAdapter",
    "jax:pallas": "conformance.adapters.jax_impl_adapter:JaxPallasAdapter",
    "jax:ring": "conformance.adapters.ring:JaxRingAdapter",
    "torch:ring": "conformance.adapters.ring:TorchRingAdapter",
    "torch-cp-flex": "conformance.adapters.torch_context_parallel:TorchContextParallelFlexAdapter",
    "torch-cp-flex-balanced": "conformance.adapters.torch_context_parallel:TorchContextParallelFlexBalancedAdapter",
    "ringattention": "conformance.adapters.ringattention:RingAttentionAdapter",
    "torch-sdpa": "conformance.adapters.torch_sdpa:TorchSDPAAdapter",
    "torch-mha": "conformance.adapters.torch_mha:TorchMHAAdapter",
    "jax-nn": "conformance.adapters.jax_nn:JaxNNAdapter",
    "flax-mha": "conformance.adapters.flax_mha:FlaxMHAAdapter",
    "onnx-reference": "conformance.adapters.onnx_reference:OnnxReferenceAdapter",
    "onnxruntime": "conformance.adapters.onnxruntime_adapter:OnnxRuntimeAdapter",
    "hf-llama-rope": "conformance.adapters.hf_rope:HFLlamaRopeAdapter",
    "hf-llama-attention": "conformance.adapters.hf_rope:HFLlamaAttentionAdapter",
    "hf-gptneox-rope": "conformance.adapters.hf_rope:HFGPTNeoXRopeAdapter",
    "hf-gptj-rope": "conformance.adapters.hf_rope:HFGPTJRopeAdapter",
    "rotary-embedding-torch": "conformance.adapters.torch_rope_libs:RotaryEmbeddingTorchAdapter",
    "torchtune-rope": "conformance.adapters.torch_rope_libs:TorchtuneRopeAdapter",
    "xt-rope": "conformance.adapters.torch_rope_libs:XTransformersRopeAdapter",
    "xt-alibi": "conformance.adapters.torch_bias_libs:XTAlibiAdapter",
    "xt-t5": "conformance.adapters.torch_bias_libs:XTT5Adapter",
    "xt-attend": "conformance.adapters.xt_attend:XTAttendAdapter",
    "hf-t5-bias": "conformance.adapters.torch_bias_libs:HFT5BiasAdapter",
    "bloom-alibi": "conformance.adapters.torch_bias_libs:BloomAlibiAdapter",
    "mpt-alibi": "conformance.adapters.torch_bias_libs:MPTAlibiAdapter",
    "falcon-alibi": "conformance.adapters.torch_bias_libs:FalconAlibiAdapter",
    "hf-swin-attention": "conformance.adapters.hf_bias_layers:HFSwinAttentionAdapter",
    "timm-window-attention": "conformance.adapters.timm_swin:TimmWindowAttentionAdapter",
    "hf-bert-relative-key": "conformance.adapters.hf_bert:HFBertRelativeKeyAdapter",
    "hf-esm-relative-key": "conformance.adapters.hf_bert:HFEsmRelativeKeyAdapter",
    "hf-bert-relative-key-query": "conformance.adapters.hf_bert:HFBertRelativeKeyQueryAdapter",
    "hf-esm-relative-key-query": "conformance.adapters.hf_bert:HFEsmRelativeKeyQueryAdapter",
    "hf-albert-relative-key": "conformance.adapters.hf_bert:HFAlbertRelativeKeyAdapter",
    "hf-albert-relative-key-query": "conformance.adapters.hf_bert:HFAlbertRelativeKeyQueryAdapter",
    "hf-wav2vec2-bert-relative-key": "conformance.adapters.hf_relative:HFWav2Vec2BertRelativeKeyAdapter",
    "hf-deberta-v2-attention": "conformance.adapters.hf_relative:HFDebertaV2AttentionAdapter",
    "t2t-shaw": "conformance.adapters.t2t:T2TShawAdapter",
    "t2t-huang": "conformance.adapters.t2t:T2THuangAdapter",
    "hf-t5-attention": "conformance.adapters.hf_bias_layers:HFT5AttentionAdapter",
    "keras-hub-rope": "conformance.adapters.jax_rope_libs:KerasHubRopeAdapter",
    "gemma-rope": "conformance.adapters.jax_rope_libs:GemmaRopeAdapter",
    "keras-hub-alibi": "conformance.adapters.jax_bias_libs:KerasHubAlibiAdapter",
}

#: Built-in adapters that ``python -m conformance run`` leaves out unless named (``--adapter``) or asked for
#: (``--all``), with the reason; ``.ci/run`` runs them. Each compiles many programs that no other cell shares.
EXTENDED = {
    "jax:xla": "jax_impl's readable baseline kernel compiles about 260 XLA programs of its own (Shaw, Huang and "
    "the plain causal rule differ from the tiles kernel the automatic choice runs), about 3.5 more minutes "
    "on 2 cores; the kernel tests check it against the reference in pytest",
    "torch:flex": "FlexAttention runs eagerly on a CPU (it vmaps its score_mod over every pair; the Shaw value term "
    "adds a second call): about 7 minutes of the 2 cores over four dtypes; tests/test_torch_kernels.py checks it "
    "against the reference (pytest -m fused)",
    "jax:pallas": "the fused Pallas kernel runs in interpret mode on a CPU: one program traced and compiled per case "
    "and dtype, about 3 more minutes on 2 cores; tests/test_jax_pallas.py checks it against the reference "
    "(pytest -m fused)",
    "torch:triton": "the fused Triton programs run in Triton's interpreter where no CUDA device is present (when the "
    "triton extra is installed): about 3 more minutes on 2 cores; tests/test_torch_triton.py checks them against "
    "the reference (pytest -m fused)",
    "jax:ring": "the JAX ring runs in a process of 8 host devices and compiles a sharded program per case and dtype "
    "(forward and gradients), about 1.1 s each on 2 cores; tests/test_jax_ring.py checks it against the reference "
    "(pytest -m ring)",
    "torch:ring": "the PyTorch ring runs over 4 gloo processes; tests/test_torch_ring.py checks it against the "
    "reference (pytest -m ring)",
    "ringattention": "ringattention's JAX ring runs in a process of 8 host devices and compiles a sharded program "
    "per case and dtype (forward and gradients); tests/test_ringattention.py checks it against the reference "
    "(pytest -m ring)",
    "torch-cp-flex": "PyTorch's context parallelism runs over 2 gloo processes, FlexAttention eagerly in each; "
    "tests/test_torch_context_parallel.py checks it against the reference (pytest -m ring)",
    "torch-cp-flex-balanced": "PyTorch's context parallelism with its load balancer runs over 2 gloo processes, "
    "FlexAttention eagerly in each; tests/test_torch_context_parallel.py checks it against the reference "
    "(pytest -m ring)",
}


class AdapterError(LookupError):
    """An adapter name or spec that cannot be resolved."""


def _load_spec(target: str):
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise AdapterError(f"adapter {target!r}: expected NAME or module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise AdapterError(f"adapter {target!r}: cannot import {module_name} ({e})") from None
    try:
        cls = getattr(module, attr)
    except AttributeError:
        raise AdapterError(f"adapter {target!r}: {module_name} has no attribute {attr}") from None
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise AdapterError(f"adapter {target!r}: expected a subclass of conformance.adapters.Adapter, got {cls!r}")
    return cls


def entry_points() -> dict:
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_names() -> list:
    from ..mutants import MUTANTS

    return list(BUILTIN) + sorted(entry_points()) + [f"mutant/{n}" for n in MUTANTS]


def load_adapter(name: str) -> Adapter:
    """An adapter instance from a built-in name, an entry-point name, mutant/NAME or module:Class."""
    if name.startswith("mutant/"):
        from ..mutants import MUTANTS

        if name[len("mutant/") :] not in MUTANTS:
            raise AdapterError(f"adapter {name!r}: expected one of mutant/{', mutant/'.join(MUTANTS)}")
        return MUTANTS[name[len("mutant/") :]]()
    target = BUILTIN.get(name) or entry_points().get(name)
    # "torch:nope" is a mistyped kernel adapter name (prefix of a built-in one), not module:Class
    if target is None and (":" not in name or name.partition(":")[0] in BUILTIN):
        raise AdapterError(f"unknown adapter {name!r}: expected one of {', '.join(available_names())} or module:Class")
    return _load_spec(target or name)()


__all__ = [
    "Adapter",
    "Capabilities",
    "BUILTIN",
    "EXTENDED",
    "load_adapter",
    "available_names",
    "AdapterError",
    "ENTRY_POINT_GROUP",
]
