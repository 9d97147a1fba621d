"""The index machinery of the relative terms, checked against plain indexing."""

import numpy as np
import pytest

from numpy_ref import relative as rel
from numpy_ref.masking import relative_distance


@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 5), (5, 1), (3, 7), (7, 3), (6, 6)])
def test_skew_is_the_diagonal_shift(Lq, Lk):
    W = Lq + Lk - 1
    r = np.random.default_rng(0).normal(size=(2, 3, Lq, W))
    i, j = np.meshgrid(np.arange(Lq), np.arange(Lk), indexing="ij")
    np.testing.assert_array_equal(rel.skew(r, Lk), r[..., i, j - i + Lq - 1])


@pytest.mark.parametrize("Lq,Lk", [(1, 4), (4, 1), (3, 5), (5, 5)])
def test_unskew_is_the_adjoint_of_skew(Lq, Lk):
    rng = np.random.default_rng(1)
    W = Lq + Lk - 1
    r, g = rng.normal(size=(1, 2, Lq, W)), rng.normal(size=(1, 2, Lq, Lk))
    assert np.isclose(np.sum(rel.skew(r, Lk) * g), np.sum(r * rel.unskew(g, W)), rtol=1e-14)


def test_scatter_buckets_is_the_adjoint_of_gather_buckets():
    rng = np.random.default_rng(2)
    index = rng.integers(0, 4, size=(2, 3, 5))
    r, g = rng.normal(size=(2, 2, 3, 4)), rng.normal(size=(2, 2, 3, 5))
    assert np.isclose(np.sum(rel.gather_buckets(r, index) * g), np.sum(r * rel.scatter_buckets(g, index, 4)))


def test_gather_logits_is_the_dot_with_the_indexed_row():
    """SHAW-3 / HUANG-4: out[b, h, i, j] = q[b, h, i] . table[h, index[b, i, j]]."""
    rng = np.random.default_rng(3)
    q, table4 = rng.normal(size=(2, 2, 3, 4)), rng.normal(size=(1, 2, 5, 4))
    index = rng.integers(0, 5, size=(2, 3, 6))
    rows = table4[0][:, index].transpose(1, 0, 2, 3, 4)  # (B, H, Lq, Lk, d): fine at test sizes
    np.testing.assert_allclose(
        rel.gather_logits(q, table4, index), np.einsum("bhid,bhijd->bhij", q, rows), rtol=1e-14, atol=1e-14
    )


def test_gather_logits_vjp_is_its_gradient():
    """f(q, t) = <g, gather_logits(q, t)> is bilinear, so <df/dq, q> = <df/dt, t> = f."""
    rng = np.random.default_rng(4)
    q, table4, g = rng.normal(size=(1, 2, 3, 4)), rng.normal(size=(1, 1, 5, 4)), rng.normal(size=(1, 2, 3, 6))
    index = rng.integers(0, 5, size=(1, 3, 6))
    f = np.sum(g * rel.gather_logits(q, table4, index))
    dq, dt = rel.gather_logits_vjp(q, table4, index, g)
    assert dq.shape == q.shape and dt.shape == table4.shape
    assert np.isclose(np.sum(dq * q), f, rtol=1e-13) and np.isclose(np.sum(dt * table4), f, rtol=1e-13)


def test_reachable_rows_are_zero_beyond_the_table():
    table = np.arange(1.0, 6.0)[:, None]  # M = 3: rows for distances -2..2 hold 1..5
    rows, row, valid = rel.reachable_rows(rel.as_4d(table), np.array([0]), Lq=3, Lk=4, max_len=3)
    # distances -2 .. 3: the last one is beyond the table
    assert rows[0, 0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 0.0]
    assert valid.tolist() == [[True] * 5 + [False]]


def test_contiguous_offset_detects_runs():
    assert rel.contiguous_offset(np.array([[3, 4, 5]]), np.array([[0, 1]])).tolist() == [-3]
    assert rel.contiguous_offset(np.array([[0, 2, 4]]), np.array([[0, 1]])) is None
    assert rel.contiguous_offset(np.array([[7]]), np.array([[9]])).tolist() == [2]


def test_relative_distance_is_key_minus_query():
    delta = relative_distance(np.array([[0, 1]]), np.array([[0, 1, 2]]))
    assert delta[0].tolist() == [[0, 1, 2], [-1, 0, 1]]


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("first,count", [(-9, 4), (-4, 6), (-2, 3), (0, 2), (1, 7), (5, 3)])
def test_distance_rows_of_the_implementations_are_table_rows_or_zero(framework, first, count):
    """HUANG-2/3: torch_impl and jax_impl slice the rows of distances first .. first+count-1, zero outside."""
    impl = pytest.importorskip(
        f"{framework}_impl.schemes.huang", reason=f"needs {framework}: pip install attnspec[{framework}]"
    )
    asarray = {
        "torch": lambda a: pytest.importorskip("torch").as_tensor(a),
        "jax": lambda a: pytest.importorskip("jax.numpy").asarray(a),
    }[framework]
    M = 3
    table = np.arange(1.0, 2 * M)[:, None] * np.array([[1.0, -1.0]])  # rows for distances -2..2
    expected = np.array([table[t + M - 1] if abs(t) <= M - 1 else [0.0, 0.0] for t in range(first, first + count)])
    got = np.asarray(impl.distance_rows(asarray(table), first, count, M))
    np.testing.assert_array_equal(got, expected)
