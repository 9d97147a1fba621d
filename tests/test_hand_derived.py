"""Cases whose expected numbers are derived on paper (derivations in comments)."""

import math

import numpy as np

import numpy_ref
from spec import AttentionSpec, Huang, Shaw

E = math.e


def test_two_heads_split_contiguously_and_output_projection():
    # H = 2, d = 1 (s = 1), identity q/k/v, tokens x0 = [1, 0], x1 = [0, 1].
    # Head 0 sees feature 0: q = k = v = [1, 0] over the two tokens.
    #   query 0: logits [1, 0] -> w = [e, 1]/(e+1) -> o = e/(e+1); query 1: q = 0 -> uniform -> 1/2.
    # Head 1 sees feature 1: q = k = v = [0, 1].
    #   query 0: uniform -> 1/2; query 1: logits [0, 1] -> o = e/(e+1).
    # merged = [[e/(e+1), 1/2], [1/2, e/(e+1)]]; wo swaps the two features, bo = [10, 20].
    spec = AttentionSpec(num_heads=2, head_dim=1)
    p = numpy_ref.identity_params(spec)
    p["wo"] = np.array([[0.0, 1.0], [1.0, 0.0]])
    p["bo"] = np.array([10.0, 20.0])
    x = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    a = E / (E + 1)
    expected = np.array([[[0.5 + 10, a + 20], [a + 10, 0.5 + 20]]])
    np.testing.assert_allclose(numpy_ref.attention(spec, p, x), expected, rtol=0, atol=1e-15)


def test_scale_defaults_to_inverse_sqrt_head_dim():
    # d = 4: s = 1/2; logits [2, 0]; output row 0 = [1, tanh 1, 1, tanh 1].
    spec = AttentionSpec(num_heads=1, head_dim=4)
    x = np.array([[[1.0, 1, 1, 1], [1, -1, 1, -1]]])
    out = numpy_ref.attention(spec, numpy_ref.identity_params(spec), x)
    t = math.tanh(1.0)
    np.testing.assert_allclose(out[0], [[1, t, 1, t], [1, -t, 1, -t]], rtol=0, atol=1e-15)


def test_explicit_scale_and_unscaled_bias():
    # d = 4, scale = 1/4: q0.k0 = 4 -> 1; bias +1 on key 1 (unscaled): logits [1, 1] -> uniform.
    spec = AttentionSpec(num_heads=1, head_dim=4, scale=0.25)
    x = np.array([[[1.0, 1, 1, 1], [0, 0, 0, 0]]])
    bias = np.array([[0.0, 1.0], [0.0, 0.0]])
    _, w = numpy_ref.attention(spec, numpy_ref.identity_params(spec), x, bias=bias, return_weights=True)
    np.testing.assert_allclose(w[0, 0, 0], [0.5, 0.5], rtol=0, atol=1e-15)


def test_shaw_clipping_and_value_term():
    # Derivation in spec/attention.md, SHAW-2..4: weights [1,2,2]/5, [1,1,2]/4, [1,1,1]/3;
    # outputs 1 + 0.8, 1 + 0.25, 1 - 2/3.
    spec = AttentionSpec(num_heads=1, head_dim=1, relative=Shaw(max_distance=1))
    p = numpy_ref.identity_params(spec)
    p["rel_k"] = np.array([[0.0], [0.0], [math.log(2)]])
    p["rel_v"] = np.array([[-1.0], [0.0], [1.0]])
    out, w = numpy_ref.attention(spec, p, np.ones((1, 3, 1)), return_weights=True)
    np.testing.assert_allclose(w[0, 0], [[0.2, 0.4, 0.4], [0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]], atol=1e-15)
    np.testing.assert_allclose(out[0, :, 0], [1.8, 1.25, 1 / 3], atol=1e-15)


def test_huang_zero_beyond_table_and_unscaled_relative_term():
    # M = 2, d = 4 so s = 1/2; q = [1,1,1,1] for every token, k = 0 (content logits 0).
    # rel_k row for distance +1 is [ln 4/4]*4, so q . row = ln 4; unscaled -> weight ratio 4.
    # Query 0 sees distances 0, 1, 2 -> [0, ln 4, nothing] -> weights [1, 4, 1] / 6.
    spec = AttentionSpec(num_heads=1, head_dim=4, relative=Huang(max_len=2, per_head=False), scale_relative=False)
    p = numpy_ref.identity_params(spec)
    p["wk"] = np.zeros((4, 4))
    p["rel_k"] = np.zeros((3, 4))
    p["rel_k"][2] = math.log(4) / 4
    _, w = numpy_ref.attention(spec, p, np.ones((1, 3, 4)), return_weights=True)
    np.testing.assert_allclose(w[0, 0, 0], [1 / 6, 4 / 6, 1 / 6], atol=1e-15)
    # scaled (the default): the term is ln 4 / 2 = ln 2 -> [1, 2, 1] / 4
    from dataclasses import replace

    _, w = numpy_ref.attention(replace(spec, scale_relative=True), p, np.ones((1, 3, 4)), return_weights=True)
    np.testing.assert_allclose(w[0, 0, 0], [0.25, 0.5, 0.25], atol=1e-15)


def test_shaw_index_matches_the_clamped_distance_table():
    # k = 2, L = 8: the first row of clip(j - i, -2, 2) + 2 is [2, 3, 4, 4, 4, 4, 4, 4],
    # the last [0, 0, 0, 0, 0, 0, 1, 2].
    from numpy_ref.masking import relative_distance
    from numpy_ref.relative import shaw_index

    idx = shaw_index(relative_distance(np.arange(8)[None], np.arange(8)[None]), 2)[0]
    assert idx[0].tolist() == [2, 3, 4, 4, 4, 4, 4, 4]
    assert idx[3].tolist() == [0, 0, 1, 2, 3, 4, 4, 4]
    assert idx[7].tolist() == [0, 0, 0, 0, 0, 0, 1, 2]


def test_gradients_of_a_single_key_layer():
    # One key: the weight is 1 whatever q and k are, so d query = d key = 0 exactly,
    # d value = g (identity weights), d bias = 0.
    spec = AttentionSpec(num_heads=1, head_dim=2)
    p = numpy_ref.identity_params(spec)
    x, kv = np.array([[[0.3, -0.2]]]), np.array([[[1.0, 2.0]]])
    g = np.array([[[0.5, -1.5]]])
    grads = numpy_ref.attention_vjp(spec, p, x, kv, kv.copy(), g, bias=np.zeros((1, 1)))
    assert np.all(grads["query"] == 0) and np.all(grads["key"] == 0) and np.all(grads["bias"] == 0)
    np.testing.assert_allclose(grads["value"], g, atol=1e-15)


def test_bias_gradient_of_two_keys():
    # q = 0, values 3 and 1, bias [0, 0]: w = [1/2, 1/2], out = w0*3 + w1*1.
    # d out / d bias0 = w0 w1 (3 - 1) = 0.5; d out / d bias1 = -0.5.
    spec = AttentionSpec(num_heads=1, head_dim=1)
    p = numpy_ref.identity_params(spec)
    q, kv = np.zeros((1, 1, 1)), np.array([[[3.0], [1.0]]])
    grads = numpy_ref.attention_vjp(spec, p, q, kv, kv.copy(), np.ones((1, 1, 1)), bias=np.zeros((1, 2)))
    np.testing.assert_allclose(grads["bias"], [[0.5, -0.5]], atol=1e-15)
