"""``ringattention`` 0.1.2's JAX ring through the ``ringattention`` adapter (8 host devices in a process of its own):
against the float64 reference where it follows the spec, and each of its departures measured against what the
reference gives for the inputs the ring actually sees. Marker ``ring``.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")
# not imported: its __init__ fails on jax 0.10 (the adapter's docstring)
if importlib.util.find_spec("ringattention") is None:
    pytest.skip("ringattention is not installed (pip install attnspec[ringattention])", allow_module_level=True)
pytest.importorskip("einops")

import numpy_ref  # noqa: E402
from conformance.adapters.ringattention import RingAttentionAdapter  # noqa: E402
from spec import Alibi, AttentionSpec, Rope, Swin, T5Bias  # noqa: E402

pytestmark = pytest.mark.ring

REFERENCE_ARGS = ("mask", "bias", "q_positions", "k_positions")


@pytest.fixture(scope="module")
def ring():
    adapter = RingAttentionAdapter()
    yield adapter
    if adapter._workers is not None:
        adapter._workers.stop()


def _call(spec, Lq=16, Lk=None, seed=0, **inputs):
    rng = np.random.default_rng(seed)
    params = {k: rng.normal(size=a.shape) for k, a in numpy_ref.init_params(spec, 0).items()}
    D = spec.num_heads * spec.head_dim
    call = {"query": rng.normal(size=(2, Lq, D))}
    if Lk is not None:
        call["key"] = rng.normal(size=(2, Lk, D))
        call["value"] = rng.normal(size=(2, Lk, D))
    return params, {**call, **inputs}


def _reference(spec, params, inputs):
    kw = {k: v for k, v in inputs.items() if k in REFERENCE_ARGS}
    return numpy_ref.attention(spec, params, inputs["query"], inputs.get("key"), inputs.get("value"), **kw)


def _reference_vjp(spec, params, inputs, g):
    """numpy_ref's gradients; a self-attention call's key and value (the query again) with gradients of their own,
    as the adapter returns them."""
    kw = {k: v for k, v in inputs.items() if k in REFERENCE_ARGS}
    key = inputs.get("key", inputs["query"])
    return numpy_ref.attention_vjp(spec, params, inputs["query"], key, inputs.get("value", key), g, **kw)


def _close(got, want, tol=1e-12):
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * max(1.0, np.abs(want).max()))


CALLS = {
    "vanilla-custom-scale-cross": (AttentionSpec(2, 4, scale=0.3), dict(Lq=12, Lk=20)),
    "alibi-causal": (AttentionSpec(4, 2, relative=Alibi(), causal=True), {}),
    "t5-mask": (AttentionSpec(2, 4, relative=T5Bias(8, 12)), {"mask": np.random.default_rng(1).random((16, 16)) > 0.2}),
    "rope-gqa-window": (AttentionSpec(4, 2, num_kv_heads=2, relative=Rope(), window=(3, 2)), dict(Lq=13)),
    "swin": (AttentionSpec(2, 4, relative=Swin((4, 4))), {}),
}


@pytest.mark.parametrize("name", CALLS)
def test_the_ring_is_the_reference_where_it_follows_the_spec(ring, name):
    """BLOCK-1..BLOCK-3, BLOCK-6: output and the gradients of the inputs and projections equal numpy_ref's in
    float64 (2, 4 or 8 shards by the call; lengths padded); the bias's and the tables' gradients are the
    deviation below."""
    spec, kw = CALLS[name]
    lengths = {k: kw.pop(k) for k in ("Lq", "Lk") if k in kw}
    params, inputs = _call(spec, **lengths, **kw)
    want = _reference(spec, params, inputs)
    _close(ring.forward(spec, params, inputs, device="cpu", need_weights=False)["out"], want)
    g = np.random.default_rng(7).normal(size=want.shape)
    got = ring.vjp(spec, params, inputs, g, device="cpu")
    ref = _reference_vjp(spec, params, inputs, g)
    for k in ("query", "key", "value", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
        if k in ref and k in got:
            _close(got[k], ref[k])


def test_causality_merged_by_minimum_clips_a_positive_bias(ring):
    """CAUSAL-1, BIAS-1: under causal_block_size the bias on allowed pairs becomes min(bias, 0): the ring's output
    is the reference's for the clipped bias, and wrong for the bias given by more than 0.5."""
    spec = AttentionSpec(2, 4, causal=True)
    bias = 2.0 * np.abs(np.random.default_rng(3).normal(size=(16, 16)))
    params, inputs = _call(spec, bias=bias)
    got = ring.forward(spec, params, inputs, device="cpu", need_weights=False)["out"]
    _close(got, _reference(spec, params, {**inputs, "bias": np.minimum(bias, 0.0)}))
    assert np.abs(got - _reference(spec, params, inputs)).max() > 0.5


def test_causality_on_token_indices_not_positions(ring):
    """CAUSAL-1, POS-2: queries at positions 8..23 (a chunk after 8 cached tokens) may attend every key at 0..15;
    the ring compares token indices and gives query i keys 0..i, the reference's result at positions arange(16)."""
    spec = AttentionSpec(2, 4, causal=True)
    params, inputs = _call(spec, q_positions=np.arange(16) + 8)
    got = ring.forward(spec, params, inputs, device="cpu", need_weights=False)["out"]
    _close(got, _reference(spec, params, {k: v for k, v in inputs.items() if k != "q_positions"}))
    assert np.abs(got - _reference(spec, params, inputs)).max() > 0.1


def test_a_fully_masked_row_is_the_mean_of_the_values(ring):
    """MASK-5: a disallowed pair gets finfo.min added; in float64 every logit of an empty row rounds to finfo.min,
    so its weights are uniform: the row is the mean of the projected values, merged and projected (not bo)."""
    spec = AttentionSpec(2, 4)
    mask = np.ones((16, 16), bool)
    mask[5] = False
    params, inputs = _call(spec, mask=mask)
    got = ring.forward(spec, params, inputs, device="cpu", need_weights=False)["out"]
    v = inputs["query"] @ params["wv"] + params["bv"]  # (B, L, D): every head's values side by side
    _close(got[:, 5], v.mean(axis=1) @ params["wo"] + params["bo"])
    want = _reference(spec, params, inputs)
    _close(np.delete(got, 5, axis=1), np.delete(want, 5, axis=1))
    np.testing.assert_array_equal(want[:, 5], np.broadcast_to(params["bo"], want[:, 5].shape))


def test_the_bias_gets_no_gradient(ring):
    """GRAD-1: the custom VJP returns None for attn_bias: the bias's gradient and T5's table's are 0 where the
    reference's are not."""
    spec = AttentionSpec(2, 4, relative=T5Bias(8, 12))
    params, inputs = _call(spec, bias=np.random.default_rng(4).normal(size=(16, 16)))
    g = np.random.default_rng(5).normal(size=(2, 16, 8))
    got = ring.vjp(spec, params, inputs, g, device="cpu")
    ref = _reference_vjp(spec, params, inputs, g)
    for name in ("bias", "rel_b"):
        np.testing.assert_array_equal(got[name], 0.0)
        assert np.abs(ref[name]).max() > 0.1


SCRIPT = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, PartitionSpec as P
from conformance.adapters.ringattention import load

ring = load()
rng = np.random.default_rng(0)
B, L, H, d = 1, 16, 2, 4
q, k, v = (rng.normal(size=(B, L, H, d)) for _ in range(3))
bias = rng.normal(size=(B, H, L, L))
mesh = Mesh(np.array(jax.devices()[:2]), ("seq",))

def run(chunk, b):
    kw = dict(causal_block_size=None, query_chunk_size=chunk, key_chunk_size=L // 2, deterministic=True,
              dropout_rng=None, attn_pdrop=0.0, dtype=jnp.float64, policy=jax.checkpoint_policies.nothing_saveable,
              precision=jax.lax.Precision.HIGHEST, prevent_cse=True)
    f = jax.shard_map(lambda q, k, v, b: ring.ring_attention(q, k, v, b, None, None, "seq", False, kw), mesh=mesh,
                      in_specs=(P(None, "seq"),) * 3 + (P(None, None, "seq"),), out_specs=P(None, "seq"),
                      check_vma=False)
    return np.asarray(f(q, k, v, b))

whole = run(L // 2, bias)  # one query chunk per shard
chunked = run(L // 4, bias)  # two: each takes its shard's first L // 4 rows of the bias
first_rows = bias.copy()
for s in range(2):
    first_rows[:, :, s * 8 + 4 : s * 8 + 8] = bias[:, :, s * 8 : s * 8 + 4]
out = {"chunked_vs_whole": float(np.abs(chunked - whole).max()),
       "chunked_vs_first_rows": float(np.abs(chunked - run(L // 2, first_rows)).max())}

# causal, one-token query chunks: below_or_on_diag asks (r + 1) * 1 - 1 > c * 1, so the key chunk holding the
# query's own token is skipped
kw = dict(causal_block_size=1, query_chunk_size=1, key_chunk_size=1, deterministic=True, dropout_rng=None,
          attn_pdrop=0.0, dtype=jnp.float64, policy=jax.checkpoint_policies.nothing_saveable,
          precision=jax.lax.Precision.HIGHEST, prevent_cse=True)
f = jax.shard_map(lambda q, k, v: ring.ring_attention(q, k, v, None, None, None, "seq", False, kw), mesh=mesh,
                  in_specs=(P(None, "seq"),) * 3, out_specs=P(None, "seq"), check_vma=False)
got = np.asarray(f(q, k, v))
logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
strict = np.tril(np.ones((L, L), bool), -1)  # key j < query i: the diagonal left out
w = np.exp(np.where(strict, logits - logits.max(-1, keepdims=True), -np.inf))
want = np.einsum("bhqk,bkhd->bqhd", w[:, :, 1:] / w[:, :, 1:].sum(-1, keepdims=True), v)
out["row0_nan"] = bool(np.isnan(got[:, 0]).all())
out["strictly_causal"] = float(np.abs(got[:, 1:] - want).max())
print(json.dumps(out))
"""


def test_query_chunks_smaller_than_a_shard_read_the_first_rows_of_the_bias_and_skip_the_diagonal():
    """BIAS-1: ``_chunk_attention_bias`` slices the bias's query axis from 0 for every query chunk, so with
    ``query_chunk_size`` below the shard's length each chunk reads the shard's first rows (hence the adapter's one
    chunk per shard): the chunked ring equals the whole-shard ring given the first rows repeated, and differs from
    it given the bias."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert errors["chunked_vs_first_rows"] < 1e-12, errors
    assert errors["chunked_vs_whole"] > 0.1, errors
    # CAUSAL-1: with one-token query chunks the diagonal is lost: row 0 (no other key) is 0 / 0, every other row
    # is the strictly causal attention (key j < query i)
    assert errors["row0_nan"], errors
    assert errors["strictly_causal"] < 1e-12, errors


def test_float32_logits_gradients_come_back_in_float32(ring):
    """PREC-4: with ``float32_logits`` (16-bit inputs) the custom VJP returns q's and k's gradients in float32, so
    the projections' transpose before the ring raises; the forward alone is within the bfloat16 budget of the
    reference's output (5e-2 of its largest entry)."""
    import ml_dtypes

    spec = AttentionSpec(2, 4)
    params, inputs = _call(spec)
    low = {k: a.astype(ml_dtypes.bfloat16) for k, a in params.items()}
    x = {k: a.astype(ml_dtypes.bfloat16) for k, a in inputs.items()}
    with pytest.raises(TypeError, match="lax.mul requires arguments to have the same dtypes, got float32, bfloat16"):
        ring.vjp(spec, low, x, x["query"], device="cpu")
    got = ring.forward(spec, low, x, device="cpu", need_weights=False)["out"].astype(np.float64)
    want = _reference(spec, {k: a.astype(np.float64) for k, a in low.items()}, {"query": x["query"].astype(np.float64)})
    assert np.abs(got - want).max() < 5e-2 * np.abs(want).max()
