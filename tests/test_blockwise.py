"""BLOCK-1..BLOCK-4: ``numpy_ref.attention_blockwise`` (every split of the keys, combined by log-sum-exps) equals
``numpy_ref.attention`` for random calls of every scheme and option; its split and its statistics by hand.
BLOCK-6: ``numpy_ref.attention_blockwise_vjp`` (each block's gradients from the combined statistics alone)
equals ``numpy_ref.attention_vjp``."""

import numpy as np
import pytest
from _random_calls import random_call
from hypothesis import given, settings
from hypothesis import strategies as st

import numpy_ref
from numpy_ref.blockwise import combine, key_split
from spec import AttentionSpec, Shaw


def random_split(rng, Lk: int) -> list:
    """Blocks of random sizes (some empty) holding a random permutation of the keys."""
    order = rng.permutation(Lk)
    cuts = np.sort(rng.integers(0, Lk + 1, size=rng.integers(0, 5)))
    return np.split(order, cuts)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_split_of_the_keys_gives_the_unsplit_attention(seed):
    """BLOCK-4 over random calls (Shaw and Huang with value terms, RoPE, ALiBi, T5, Swin, grouped heads, masks
    with empty rows, -inf biases, dropout keep masks, mask_fill, soft caps, windows, explicit positions): each
    block uses its keys' global positions (BLOCK-1), and the combination of the blocks' (lse, o) is the
    attention of the whole call to float64 rounding."""
    call = random_call(seed, max_len=7)
    rng = np.random.default_rng(seed)
    Lk = call.key.shape[1]
    want = numpy_ref.attention(*call.args(), **call.kwargs)
    got = numpy_ref.attention_blockwise(*call.args(), key_blocks=random_split(rng, Lk), **call.kwargs)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_split_of_the_keys_gives_the_unsplit_gradients(seed):
    """BLOCK-6 over the same random calls: each block differentiated alone, from its share of each row and the
    row sums d_o . o, gives every gradient of the unsplit backward pass (attention_vjp) to float64 rounding."""
    call = random_call(seed, max_len=7)
    rng = np.random.default_rng(seed)
    g = rng.normal(size=call.query.shape[:2] + (call.spec.model_dim,))
    want = numpy_ref.attention_vjp(*call.args(), g, **call.kwargs)
    got = numpy_ref.attention_blockwise_vjp(
        *call.args(), g, key_blocks=random_split(rng, call.key.shape[1]), **call.kwargs
    )
    assert list(got) == list(want)
    for name in want:
        scale = max(1.0, np.abs(want[name]).max())
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-11 * scale, err_msg=name)


def test_a_block_differentiated_with_its_own_row_sums_is_wrong(monkeypatch):
    """BLOCK-6: the softmax's VJP of a block needs the whole row's sum_j w_ij dL/dw_ij; the block's own sum (its
    softmax differentiated alone, blocks then weighted by their shares) misses the shares' own gradient."""
    import numpy_ref.blockwise as blockwise
    from numpy_ref.backward import backward_heads

    spec = AttentionSpec(2, 4, relative=Shaw(2))
    rng = np.random.default_rng(5)
    params = {n: rng.normal(size=a.shape) for n, a in numpy_ref.init_params(spec, 0).items()}
    x, g = rng.normal(size=(2, 6, 8)), rng.normal(size=(2, 6, 8))
    want = numpy_ref.attention_vjp(spec, params, x, x, x, g)
    got = numpy_ref.attention_blockwise_vjp(spec, params, x, x, x, g, key_blocks=[2, 4])
    np.testing.assert_allclose(got["query"], want["query"], rtol=0, atol=1e-12)
    monkeypatch.setattr(
        blockwise, "backward_heads", lambda spec, trace, d_o, rows=None: backward_heads(spec, trace, d_o)
    )
    local = numpy_ref.attention_blockwise_vjp(spec, params, x, x, x, g, key_blocks=[2, 4])
    assert np.abs(local["query"] - want["query"]).max() > 1e-3


def test_the_blockwise_vjp_takes_the_vjp_arguments():
    """INPUT-1: key and value are required, grad_out is checked, each error names its argument."""
    spec = AttentionSpec(1, 2)
    p = numpy_ref.init_params(spec, 0)
    x = np.zeros((1, 3, 2))
    with pytest.raises(ValueError, match=r"^key: expected an array \(attention_blockwise_vjp has no self-attention"):
        numpy_ref.attention_blockwise_vjp(spec, p, x, None, x, x, key_blocks=[3])
    with pytest.raises(ValueError, match=r"^grad_out: expected shape \(B, Lq, D\) = \(1, 3, 2\), got \(1, 3, 3\)"):
        numpy_ref.attention_blockwise_vjp(spec, p, x, x, x, np.zeros((1, 3, 3)), key_blocks=[3])
    with pytest.raises(ValueError, match=r"^key_blocks: expected block sizes >= 0 summing to Lk = 3, got \[2\]"):
        numpy_ref.attention_blockwise_vjp(spec, p, x, x, x, x, key_blocks=[2])


def test_block_sizes_and_local_positions():
    """BLOCK-1: sizes are consecutive blocks; positions are the keys' global ones. A block that used its local
    indices as positions (what the blockwise oracle never does) gives another result: the check can fail."""
    spec = AttentionSpec(2, 4, relative=Shaw(2, per_head=True), causal=True)
    rng = np.random.default_rng(0)
    params = {n: rng.normal(size=a.shape) for n, a in numpy_ref.init_params(spec, 0).items()}
    x = rng.normal(size=(2, 10, 8))
    want = numpy_ref.attention(spec, params, x)
    got = numpy_ref.attention_blockwise(spec, params, x, key_blocks=[3, 0, 4, 3])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    local = [
        numpy_ref.attention(spec, params, x, x[:, a:b], k_positions=np.arange(b - a)) for a, b in ((0, 5), (5, 10))
    ]
    assert not np.allclose(local[1], want, atol=1e-3)


def test_a_row_with_no_allowed_key_in_any_block_is_exactly_zero():
    """BLOCK-3, BLOCK-4, MASK-5: blocks without an allowed key contribute nothing, never NaN; a row without any
    is exactly 0 before the output projection (its output is then bo)."""
    spec = AttentionSpec(1, 2)
    p = numpy_ref.init_params(spec, 1)
    x = np.random.default_rng(1).normal(size=(1, 4, 2))
    mask = np.ones((4, 4), bool)
    mask[1] = False  # query 1 attends nothing
    mask[2, :2] = False  # query 2 attends nothing in the first block
    got = numpy_ref.attention_blockwise(spec, p, x, mask=mask, key_blocks=[2, 2])
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[0, 1], p["bo"])
    np.testing.assert_allclose(got, numpy_ref.attention(spec, p, x, mask=mask), rtol=0, atol=1e-14)


def test_the_combination_by_hand():
    """BLOCK-3: blocks with (m, l) = (0, 1) and (log 3, 1), outputs 2 and 6, give l = 4 and o = 2/4 + 3*6/4 = 5;
    an empty block (m = -inf, l = 0) adds nothing; all blocks empty give m = -inf, l = 0 and o = 0."""
    one = lambda v: np.full((1, 1, 1), v)  # noqa: E731
    block = lambda m, s, o: (one(m), one(s), one(o)[..., None])  # noqa: E731
    m, l, o = combine([block(0.0, 1.0, 2.0), block(np.log(3.0), 1.0, 6.0)])  # noqa: E741
    assert m[0, 0, 0] == pytest.approx(np.log(3.0)) and l[0, 0, 0] == pytest.approx(4.0 / 3.0)
    assert o[0, 0, 0, 0] == pytest.approx(5.0)
    _, _, o = combine([block(-np.inf, 0.0, 0.0), block(np.log(3.0), 1.0, 6.0)])
    assert o[0, 0, 0, 0] == 6.0
    m, l, o = combine([block(-np.inf, 0.0, 0.0)] * 2)  # noqa: E741
    assert m[0, 0, 0] == -np.inf and l[0, 0, 0] == 0.0 and o[0, 0, 0, 0] == 0.0


def test_a_huge_fill_costs_the_combination_nothing():
    """BLOCK-3: with mask_fill = -1e9 a fully masked row's statistics are m = -1e9 in every block; kept apart
    from l they combine exactly (a log-sum-exp of -1e9 has a spacing of 1.2e-7 and moved the result by 1e-9)."""
    spec = AttentionSpec(1, 3, mask_fill=-1e9)
    p = numpy_ref.init_params(spec, 3)
    x = np.random.default_rng(3).normal(size=(1, 5, 3))
    mask = np.ones((5, 5), bool)
    mask[2] = False
    want = numpy_ref.attention(spec, p, x, mask=mask)
    got = numpy_ref.attention_blockwise(spec, p, x, mask=mask, key_blocks=[1, 3, 1])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "blocks,message",
    [
        ([3, 4], "key_blocks: expected block sizes >= 0 summing to Lk = 6, got [3, 4]"),
        ([[0, 1, 2], [2, 3, 4, 5]], "key_blocks: expected blocks holding every key 0 .. 5 exactly once"),
        ([[0, 1], [3, 4, 5]], "key_blocks: expected blocks holding every key 0 .. 5 exactly once"),
    ],
    ids=["sizes", "repeated-key", "missing-key"],
)
def test_a_split_that_is_not_one_is_an_error(blocks, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        key_split(blocks, 6)
