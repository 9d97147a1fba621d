"""Bad input is rejected at every public entry point with a message that names
the argument, the expected and the actual value (INPUT-1)."""

import re

import numpy as np
import pytest

import numpy_ref
from spec import AttentionSpec, Huang, Rope, Shaw, dynamic_ntk_alpha, profiles, rope_permutation

SPEC = AttentionSpec(num_heads=2, head_dim=2, relative=Shaw(1))
B, LQ, LK, D = 2, 3, 5, 4


@pytest.fixture
def args():
    rng = np.random.default_rng(0)
    return {
        "params": numpy_ref.init_params(SPEC, 0),
        "query": rng.normal(size=(B, LQ, D)),
        "key": rng.normal(size=(B, LK, D)),
        "value": rng.normal(size=(B, LK, D)),
    }


def call(args, spec=SPEC, entry=numpy_ref.attention, **kw):
    a = {**args, **{k: v for k, v in kw.items() if k in args}}
    rest = {k: v for k, v in kw.items() if k not in args}
    return entry(spec, a["params"], a["query"], a["key"], a["value"], **rest)


BAD_CALLS = [
    # (argument overrides, exception, message pattern)
    ({"query": np.zeros((LQ, D))}, ValueError, "query: expected shape (B, Lq, D) with D = model_dim = 4, got (3, 4)"),
    (
        {"query": np.zeros((B, LQ, 5))},
        ValueError,
        "query: expected shape (B, Lq, D) with D = model_dim = 4, got (2, 3, 5)",
    ),
    (
        {"query": np.zeros((B, LQ, D), dtype=np.int64)},
        TypeError,
        "query: expected a floating-point array, got dtype int64",
    ),
    (
        {"query": np.zeros((B, LQ, D), dtype=np.complex128)},
        TypeError,
        "query: expected a floating-point array, got dtype complex128",
    ),
    (
        {"key": np.zeros((3, LK, D))},
        ValueError,
        "key: expected shape (B, Lk, D) with B = 2, D = 4, Lk >= 1, got (3, 5, 4)",
    ),
    ({"key": np.zeros((B, LK, D), dtype=bool)}, TypeError, "key: expected a floating-point array, got dtype bool"),
    (
        {"value": np.zeros((B, LK + 1, D))},
        ValueError,
        "value: expected shape (B, Lk, D) = (2, 5, 4) (the key's), got (2, 6, 4)",
    ),
    (
        {"mask": np.ones((LQ, LK), dtype=np.int64)},
        TypeError,
        "mask: expected a boolean array (True = attend); for an additive float mask use bias=, got dtype int64",
    ),
    ({"mask": np.ones((LQ, LK))}, TypeError, "mask: expected a boolean array (True = attend)"),
    (
        {"mask": np.ones((B, LK), dtype=bool)},
        ValueError,
        "mask: expected a shape broadcastable to (B, H, Lq, Lk) = (2, 2, 3, 5) (rank 1 to 4, aligned from the right, each axis 1 or the full size; a key-padding mask is (B, 1, 1, Lk)), got (2, 5)",
    ),
    (
        {"mask": np.ones((1, B, 2, LQ, LK), dtype=bool)},
        ValueError,
        "mask: expected a shape broadcastable to (B, H, Lq, Lk) = (2, 2, 3, 5)",
    ),
    ({"mask": np.ones((), dtype=bool)}, ValueError, "mask: expected a shape broadcastable"),
    ({"bias": np.zeros((LQ, LK), dtype=np.int32)}, TypeError, "bias: expected a floating-point array, got dtype int32"),
    ({"bias": np.zeros((LQ, 4))}, ValueError, "bias: expected a shape broadcastable to (B, H, Lq, Lk) = (2, 2, 3, 5)"),
    (
        {"bias": np.full((LQ, LK), np.nan)},
        ValueError,
        "bias: expected finite values or -inf (which disallows a key) [BIAS-2], got nan at index (0, 0)",
    ),
    ({"bias": np.full((LQ, LK), np.inf)}, ValueError, "bias: expected finite values or -inf"),
    (
        {"q_positions": np.arange(LQ, dtype=float)},
        TypeError,
        "q_positions: expected an integer array of positions, got dtype float64",
    ),
    (
        {"q_positions": np.arange(LQ + 1)},
        ValueError,
        "q_positions: expected shape (Lq,) = (3,) or (B, Lq) = (2, 3), got (4,)",
    ),
    (
        {"k_positions": np.zeros((3, LK), dtype=int)},
        ValueError,
        "k_positions: expected shape (Lk,) = (5,) or (B, Lk) = (2, 5), got (3, 5)",
    ),
    (
        {"k_positions": np.ones(LK, dtype=bool)},
        TypeError,
        "k_positions: expected an integer array of positions, got dtype bool",
    ),
    (
        {"dropout_keep": np.ones((B, 2, LQ, LK), dtype=bool)},
        ValueError,
        "dropout_keep: expected None because spec.dropout == 0 (no dropout to apply), got an array of shape (2, 2, 3, 5)",
    ),
    ({"params": "wq"}, TypeError, "params: expected a dict of arrays, got str"),
]


@pytest.mark.parametrize(
    "overrides,exc,message", BAD_CALLS, ids=[m.split(":")[0] + "-" + str(i) for i, (_, _, m) in enumerate(BAD_CALLS)]
)
@pytest.mark.parametrize(
    "entry", [numpy_ref.attention, numpy_ref.definition.attention], ids=["attention", "definition"]
)
def test_bad_arguments(args, entry, overrides, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        call(args, entry=entry, **overrides)


def test_bad_dropout_keep(args):
    spec = AttentionSpec(2, 2, relative=Shaw(1), dropout=0.5)
    with pytest.raises(
        TypeError, match=re.escape("dropout_keep: expected a boolean keep mask (True = keep), got dtype float64")
    ):
        call(args, spec=spec, dropout_keep=np.ones((B, 2, LQ, LK)))
    with pytest.raises(
        ValueError, match=re.escape("dropout_keep: expected shape (B, H, Lq, Lk) = (2, 2, 3, 5), got (1, 2, 3, 5)")
    ):
        call(args, spec=spec, dropout_keep=np.ones((1, 2, LQ, LK), dtype=bool))


@pytest.mark.parametrize(
    "mutate,exc,message",
    [
        (
            lambda p: p.pop("rel_v"),
            ValueError,
            "params: expected entries ['wq', 'wk', 'wv', 'wo', 'bq', 'bk', 'bv', 'bo', 'rel_k', 'rel_v'] for this spec, got missing ['rel_v']",
        ),
        (
            lambda p: p.update(rel_x=np.zeros(3)),
            ValueError,
            "params: expected entries ['wq', 'wk', 'wv', 'wo', 'bq', 'bk', 'bv', 'bo', 'rel_k', 'rel_v'] for this spec (no others), got unexpected ['rel_x']",
        ),
        (lambda p: p.update(wq=np.zeros((4, 5))), ValueError, "params['wq']: expected shape (4, 4), got (4, 5)"),
        (
            lambda p: p.update(rel_k=np.zeros((2, 3, 2))),
            ValueError,
            "params['rel_k']: expected shape (3, 2), got (2, 3, 2)",
        ),
        (
            lambda p: p.update(bo=np.zeros(4, dtype=np.int8)),
            TypeError,
            "params['bo']: expected a floating-point array, got dtype int8",
        ),
    ],
)
def test_bad_params(args, mutate, exc, message):
    mutate(args["params"])
    with pytest.raises(exc, match=re.escape(message)):
        call(args)


def test_spec_must_be_an_attention_spec(args):
    with pytest.raises(TypeError, match=re.escape("spec: expected an AttentionSpec, got dict")):
        numpy_ref.attention({"num_heads": 2}, args["params"], args["query"])


def test_vjp_needs_key_value_and_a_matching_grad_out(args):
    g = np.zeros((B, LQ, D))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "key: expected an array (attention_vjp has no self-attention default; pass the query again and add the gradients), got None"
        ),
    ):
        numpy_ref.attention_vjp(SPEC, args["params"], args["query"], None, args["value"], g)
    with pytest.raises(ValueError, match=re.escape("grad_out: expected shape (B, Lq, D) = (2, 3, 4), got (2, 5, 4)")):
        call(args, entry=numpy_ref.attention_vjp, grad_out=np.zeros((B, LK, D)))
    with pytest.raises(TypeError, match=re.escape("grad_out: expected a floating-point array, got dtype int64")):
        call(args, entry=numpy_ref.attention_vjp, grad_out=np.zeros((B, LQ, D), dtype=np.int64))


def test_vjp_validates_like_attention(args):
    with pytest.raises(TypeError, match=re.escape("mask: expected a boolean array (True = attend)")):
        call(args, entry=numpy_ref.attention_vjp, grad_out=np.zeros((B, LQ, D)), mask=np.ones((LQ, LK)))


def test_init_params_seed_must_be_an_int():
    with pytest.raises(TypeError, match=re.escape("seed: expected an int, got float")):
        numpy_ref.init_params(SPEC, seed=1.5)


@pytest.mark.parametrize(
    "make,exc,message",
    [
        (lambda: AttentionSpec(0, 2), ValueError, "AttentionSpec.num_heads: expected an int >= 1, got 0"),
        (
            lambda: AttentionSpec(2.0, 2),
            TypeError,
            "AttentionSpec.num_heads: expected an int >= 1, got 2.0 of type float",
        ),
        (
            lambda: AttentionSpec(2, True),
            TypeError,
            "AttentionSpec.head_dim: expected an int >= 1, got True of type bool",
        ),
        (lambda: AttentionSpec(2, 2, bias=1), TypeError, "AttentionSpec.bias: expected a bool, got 1 of type int"),
        (
            lambda: AttentionSpec(2, 2, scale=-1.0),
            ValueError,
            "AttentionSpec.scale: expected a finite number > 0 or None, got -1.0",
        ),
        (
            lambda: AttentionSpec(2, 2, scale=float("nan")),
            ValueError,
            "AttentionSpec.scale: expected a finite number > 0 or None, got nan",
        ),
        (
            lambda: AttentionSpec(2, 2, scale="0.5"),
            TypeError,
            "AttentionSpec.scale: expected a real number, got '0.5' of type str",
        ),
        (
            lambda: AttentionSpec(2, 2, relative="shaw"),
            TypeError,
            "AttentionSpec.relative: expected None or a registered scheme (Huang(...), Rope(...), Shaw(...), Alibi(...), T5Bias(...), Swin(...)), got 'shaw' of type str",
        ),
        (
            lambda: AttentionSpec(2, 2, causal=None),
            TypeError,
            "AttentionSpec.causal: expected a bool, got None of type NoneType",
        ),
        (
            lambda: AttentionSpec(2, 2, mask_fill=float("-inf")),
            ValueError,
            "AttentionSpec.mask_fill: expected a finite float or None (None gives disallowed keys weight exactly 0), got -inf",
        ),
        (
            lambda: AttentionSpec(2, 2, dropout=1.0),
            ValueError,
            "AttentionSpec.dropout: expected a probability in [0, 1), got 1.0",
        ),
        (
            lambda: AttentionSpec(2, 2, dropout=-0.1),
            ValueError,
            "AttentionSpec.dropout: expected a probability in [0, 1), got -0.1",
        ),
        (
            lambda: AttentionSpec(4, 2, num_kv_heads=3),
            ValueError,
            "AttentionSpec.num_kv_heads: expected None or a divisor of num_heads = 4 (each key/value head serves num_heads / num_kv_heads query heads), got 3",
        ),
        (
            lambda: AttentionSpec(4, 2, num_kv_heads=0),
            ValueError,
            "AttentionSpec.num_kv_heads: expected an int >= 1, got 0",
        ),
        (
            lambda: AttentionSpec(4, 2, num_kv_heads=2.0),
            TypeError,
            "AttentionSpec.num_kv_heads: expected an int >= 1, got 2.0 of type float",
        ),
        (
            lambda: AttentionSpec(2, 2, value_head_dim=0),
            ValueError,
            "AttentionSpec.value_head_dim: expected an int >= 1, got 0",
        ),
        (
            lambda: AttentionSpec(2, 2, softcap=0.0),
            ValueError,
            "AttentionSpec.softcap: expected a finite number > 0 or None, got 0.0",
        ),
        (
            lambda: AttentionSpec(2, 2, softcap=float("inf")),
            ValueError,
            "AttentionSpec.softcap: expected a finite number > 0 or None, got inf",
        ),
        (
            lambda: AttentionSpec(2, 2, softcap="50"),
            TypeError,
            "AttentionSpec.softcap: expected a real number, got '50' of type str",
        ),
        (
            lambda: AttentionSpec(2, 2, window=4),
            TypeError,
            "AttentionSpec.window: expected None or a pair (left, right) of ints >= 0 or None, got 4 of type int",
        ),
        (
            lambda: AttentionSpec(2, 2, window=(1, 2, 3)),
            TypeError,
            "AttentionSpec.window: expected None or a pair (left, right) of ints >= 0 or None, got (1, 2, 3) of type tuple",
        ),
        (
            lambda: AttentionSpec(2, 2, window=(-1, 0)),
            ValueError,
            "AttentionSpec.window[0]: expected an int >= 0, got -1",
        ),
        (
            lambda: AttentionSpec(2, 2, window=(1.5, 0)),
            TypeError,
            "AttentionSpec.window[0]: expected an int >= 0, got 1.5 of type float",
        ),
        (
            lambda: AttentionSpec(2, 2, window=(None, None)),
            ValueError,
            "AttentionSpec.window: expected at least one bound (window=(None, None) allows every key; use window=None), got (None, None)",
        ),
        (lambda: Shaw(-1), ValueError, "Shaw.max_distance: expected an int >= 0, got -1"),
        (lambda: Shaw(2, keys=False, values=False), ValueError, "Shaw: expected keys=True, values=True or a key_side"),
        (lambda: Shaw(2, key_side="both"), ValueError, "Shaw.key_side: expected one of (None, 'shared', 'own')"),
        (
            lambda: Shaw(2, keys=False, key_side="shared"),
            ValueError,
            "Shaw.key_side: expected keys=True with key_side='shared'",
        ),
        (lambda: Shaw(2, key_side="own", key_side_scaled=0), TypeError, "Shaw.key_side_scaled: expected a bool"),
        (lambda: Shaw(2, key_side_scaled=False), ValueError, "Shaw.key_side_scaled: expected True without a key_side"),
        (lambda: Huang(2, values=1), TypeError, "Huang.values: expected a bool, got 1 of type int"),
        (lambda: Shaw(2, per_head="yes"), TypeError, "Shaw.per_head: expected a bool, got 'yes' of type str"),
        (lambda: Huang(0), ValueError, "Huang.max_len: expected an int >= 1, got 0"),
        # ROPE-2: channels rotate in pairs, inside the head
        (
            lambda: Rope(rotary_dim=3),
            ValueError,
            "Rope.rotary_dim: expected an even int >= 2 (channels rotate in pairs, ROPE-2), got 3",
        ),
        (lambda: Rope(rotary_dim=4.0), TypeError, "Rope.rotary_dim: expected an int >= 2, got 4.0 of type float"),
        (
            lambda: AttentionSpec(2, 4, relative=Rope(rotary_dim=6)),
            ValueError,
            "Rope.rotary_dim: expected an even int <= head_dim = 4 (ROPE-2), got 6",
        ),
        (
            lambda: AttentionSpec(2, 3, relative=Rope()),
            ValueError,
            "Rope.rotary_dim: expected an even number of rotated channels (ROPE-2), got head_dim = 3 with rotary_dim=None; give an even rotary_dim",
        ),
        (
            lambda: AttentionSpec(2, 4, relative=Rope(inv_freq=(1.0, 0.5, 0.25))),
            ValueError,
            "Rope.rotary_dim: expected an even int <= head_dim = 4 (ROPE-2), got 6",
        ),
        (
            lambda: Rope(layout="neox"),
            ValueError,
            "Rope.layout: expected one of ('half', 'interleaved') (ROPE-3), got 'neox'",
        ),
        (lambda: Rope(theta=1.0), ValueError, "Rope.theta: expected a finite number > 1, got 1.0"),
        (
            lambda: Rope(inv_freq=(1.0, -0.5)),
            ValueError,
            "Rope.inv_freq[1]: expected a finite number >= 0 (ROPE-4), got -0.5",
        ),
        (
            lambda: Rope(inv_freq=(1.0, "2")),
            TypeError,
            "Rope.inv_freq[1]: expected a real number >= 0, got '2' of type str",
        ),
        (
            lambda: Rope(inv_freq=()),
            ValueError,
            "Rope.inv_freq: expected at least one frequency (ROPE-4), got an empty sequence",
        ),
        (
            lambda: Rope(inv_freq=0.5),
            TypeError,
            "Rope.inv_freq: expected None or a sequence of floats >= 0, got 0.5 of type float",
        ),
        (
            lambda: Rope(rotary_dim=4, inv_freq=(1.0,)),
            ValueError,
            "Rope.inv_freq: expected rotary_dim / 2 = 2 frequencies (ROPE-4), got 1",
        ),
        (
            lambda: Rope(attention_factor=0.0),
            ValueError,
            "Rope.attention_factor: expected a finite number > 0 (ROPE-7), got 0.0",
        ),
        (
            lambda: Rope.linear(0.0, rotary_dim=8),
            ValueError,
            "Rope.linear.factor: expected a finite number > 0, got 0.0",
        ),
        (
            lambda: Rope.linear(2.0, rotary_dim=7),
            ValueError,
            "Rope.linear.rotary_dim: expected an even int >= 2 (channels rotate in pairs, ROPE-2), got 7",
        ),
        (
            lambda: Rope.ntk(2.0, rotary_dim=2),
            ValueError,
            "Rope.ntk: expected rotary_dim >= 4 (the exponent is r / (r - 2), ROPE-13), got 2",
        ),
        (
            lambda: Rope.yarn(4.0, 4096, beta_fast=1, beta_slow=32, rotary_dim=8),
            ValueError,
            "Rope.yarn: expected beta_fast > beta_slow > 0, got beta_fast=1.0, beta_slow=32.0",
        ),
        (
            lambda: Rope.yarn(4.0, 0, rotary_dim=8),
            ValueError,
            "Rope.yarn.original_max_positions: expected an int >= 1, got 0",
        ),
        (
            lambda: Rope.llama3(8.0, 4.0, 1.0, 8192, rotary_dim=8),
            ValueError,
            "Rope.llama3: expected high_freq_factor > low_freq_factor, got 1.0 <= 4.0",
        ),
        (
            lambda: Rope.proportional(0.0, rotary_dim=8),
            ValueError,
            "Rope.proportional.fraction: expected a number in (0, 1], got 0.0",
        ),
        (
            lambda: rope_permutation(2, 6, 5),
            ValueError,
            "rope_permutation.rotary_dim: expected an even int <= head_dim = 6 (ROPE-2), got 5",
        ),
        (
            lambda: dynamic_ntk_alpha(2.0, 4096, 0),
            ValueError,
            "dynamic_ntk_alpha.context_length: expected an int >= 1, got 0",
        ),
        (
            lambda: profiles.einsum_selfattention(10, 3),
            ValueError,
            "embed_size: expected a multiple of heads = 3, got 10",
        ),
        (lambda: profiles.shaw_rpe(12, 0), ValueError, "n_heads: expected an int >= 1, got 0"),
        (
            lambda: profiles.shaw_rpe(12, 2, max_relative_position=-1),
            ValueError,
            "max_relative_position: expected an int >= 0, got -1",
        ),
        (lambda: profiles.music_relative(12, 2, seq_len=0), ValueError, "seq_len: expected an int >= 1, got 0"),
        (lambda: profiles.tutorial_mha(4.0, 2), ValueError, "feature_dim: expected an int >= 1, got 4.0"),
    ],
)
def test_bad_spec_fields(make, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        make()
