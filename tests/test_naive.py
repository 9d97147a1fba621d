"""The naive same-dtype emulation (``conformance.naive``): its own index helpers, its hooks, its independence.

The emulation is the unit of the tolerance budgets (PREC-2) and a second
implementation of the rules, so its helpers are checked here against values
written out by hand, not against ``numpy_ref``; and no module of it may
import ``numpy_ref``.
"""

import ast
import pathlib
import re
import types

import numpy as np
import pytest

import conformance.naive
import numpy_ref
from conformance.naive import ORDERS, backward, forward
from conformance.naive.keys import allowed_keys, dead_keys, positions, relative_distance
from conformance.naive.schemes import NaiveScheme, hooks_for, registered
from conformance.naive.schemes import base as schemes_base
from conformance.naive.schemes.huang import huang_index
from conformance.naive.schemes.shaw import shaw_index
from conformance.naive.tables import gather, scatter_add, sum_to
from spec import AttentionSpec, Huang, Shaw

NAIVE_DIR = pathlib.Path(conformance.naive.__file__).parent
DELTAS = np.arange(-5, 6)  # -5 .. 5


# ------------------------------------------------------------------ scheme index helpers
def test_shaw_index_clips_to_the_table_SHAW_2():
    """SHAW-2 with k = 2: row = clip(delta, -2, 2) + 2 for delta = -5 .. 5."""
    assert shaw_index(DELTAS, 2).tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4]
    assert shaw_index(DELTAS, 0).tolist() == [0] * 11


def test_huang_index_and_validity_HUANG_2_HUANG_3():
    """M = 3: rows 0..4 hold distances -2..2; beyond them the term is absent (not clipped)."""
    rows, valid = huang_index(DELTAS, 3)
    assert valid.tolist() == [False, False, False, True, True, True, True, True, False, False, False]
    assert rows.tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0]
    rows, valid = huang_index(np.array([[[0, 1, 2], [-1, 0, 1], [-2, -1, 0]]]), 3)  # (1, Lq, Lk)
    assert valid.all() and rows.tolist() == [[[2, 3, 4], [1, 2, 3], [0, 1, 2]]]


def test_scheme_hooks_give_the_table_rows():
    delta = DELTAS.reshape(1, 1, -1)
    index, valid = hooks_for(Shaw(2)).key_index(Shaw(2), delta)
    assert valid is None and index.tolist() == [[[0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4]]]
    index, valid = hooks_for(Shaw(2)).value_index(Shaw(2), delta)
    assert valid is None and index.tolist() == [[[0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4]]]
    for own in ("shared", "own"):  # SHAW-6: the key-side term reads SHAW-2's rows of rel_k or of rel_q
        scheme = Shaw(2, key_side=own)
        table, index = hooks_for(scheme).key_side_index(scheme, delta)
        assert table == {"shared": "rel_k", "own": "rel_q"}[own]
        assert index.tolist() == [[[0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4]]]
    for hook in ("key_index", "value_index"):  # HUANG-3, HUANG-6: absent beyond the table, not clipped
        index, valid = getattr(hooks_for(Huang(3)), hook)(Huang(3, values=True), delta)
        assert valid.tolist() == [[[False] * 3 + [True] * 5 + [False] * 3]]
        assert index.tolist() == [[[0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0]]]


def test_unknown_scheme_is_a_value_error_naming_the_registered_ones():
    assert {"huang", "rope", "shaw"} <= set(registered())
    unknown = types.SimpleNamespace(name="xpos", hooks=frozenset({"bias"}))
    with pytest.raises(ValueError, match="got scheme name 'xpos'") as e:
        hooks_for(unknown)
    assert f"({', '.join(registered())})" in str(e.value)


def test_a_hook_the_scheme_lacks_says_so():
    with pytest.raises(NotImplementedError, match="scheme 'huang' does not implement the key_side_term hook"):
        hooks_for(Huang(3)).key_side_index(Huang(3), DELTAS)


# ------------------------------------------------------------------ distances and keys
def test_relative_distance_is_key_minus_query_POS_2():
    q = positions(np.array([0, 2]), 2)  # (1, Lq)
    k = positions(np.array([[1, 4, 5], [0, 0, 3]]), 3)  # (B, Lk)
    assert relative_distance(q, k).tolist() == [[[1, 4, 5], [-1, 2, 3]], [[0, 0, 3], [-2, -2, 1]]]
    assert positions(None, 3).tolist() == [[0, 1, 2]]


def test_allowed_and_dead_keys_MASK_4_MASK_7():
    """B=1, H=2, Lq=2, Lk=3: causal, key 2 padded out, bias -inf at (h=1, i=1, j=0)."""
    delta = relative_distance(positions(None, 2), positions(None, 3))
    mask = np.array([True, True, False])  # (Lk,), a key-padding mask
    bias = np.zeros((2, 2, 3))  # (H, Lq, Lk)
    bias[1, 1, 0] = -np.inf
    allowed = allowed_keys((1, 2, 2, 3), delta, causal=True, mask=mask, bias=bias)
    assert allowed.tolist() == [
        [[[True, False, False], [True, True, False]], [[True, False, False], [False, True, False]]]
    ]
    assert dead_keys(allowed).tolist() == [[False, False, True]]
    # key 0 is still attended by head 0 only: not dead; without a mask nothing is dead
    assert dead_keys(allowed_keys((1, 2, 2, 3), delta, causal=False, mask=None, bias=None)).tolist() == [[False] * 3]


def test_allowed_keys_never_broadcasts_beyond_the_logits():
    delta = relative_distance(positions(None, 2), positions(None, 3))
    with pytest.raises(ValueError):
        allowed_keys((1, 2, 2, 3), delta, causal=False, mask=np.ones((2, 1, 2, 3), bool), bias=None)


# ------------------------------------------------------------------ gather / scatter / sum_to
def test_gather_and_scatter_add_by_hand():
    rows = np.array([[[[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]]]])  # (B=1, H=1, Lq=2, R=3)
    index = np.array([[[2, 0], [1, 1]]])  # (1, Lq, Lk=2)
    assert gather(rows, index).tolist() == [[[[12.0, 10.0], [21.0, 21.0]]]]
    g = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])  # (1, 1, Lq, Lk)
    out = scatter_add(g, index, 3)
    assert out.dtype == np.float64 and out.tolist() == [[[[2.0, 0.0, 1.0], [0.0, 7.0, 0.0]]]]


def test_scatter_add_is_the_adjoint_of_gather():
    rng = np.random.default_rng(0)
    rows, g = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(2, 3, 4, 6))
    index = rng.integers(0, 5, size=(1, 4, 6))  # one index shared by the batch
    assert np.isclose(np.sum(gather(rows, index) * g), np.sum(rows * scatter_add(g, index, 5)), rtol=1e-13)


def test_sum_to_undoes_broadcasting():
    x = np.arange(24.0).reshape(2, 3, 4)
    assert sum_to(x, (3, 1)).tolist() == [[60.0], [92.0], [124.0]]  # sum over axes 0 and 2
    assert sum_to(x, (1, 4)).tolist() == [[60.0, 66.0, 72.0, 78.0]]
    assert sum_to(x, (2, 3, 4)) is x
    for bad in ((2, 4), (1, 2, 3, 4), (3, 2)):
        with pytest.raises(ValueError, match=re.escape(f"broadcasts to (2, 3, 4), got {bad}")):
            sum_to(x, bad)


# ------------------------------------------------------------------ independence
def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module or ""
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.Constant) and node.value == "numpy_ref":  # importlib.import_module("numpy_ref")
            yield node.value


def test_naive_imports_nothing_from_numpy_ref():
    """PREC-2: the budgets' unit must not share a bug with the reference it measures."""
    files = sorted(NAIVE_DIR.rglob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "core.py", "shaw.py", "huang.py"}
    offenders = [
        (str(f.relative_to(NAIVE_DIR)), name)
        for f in files
        for name in _imports(ast.parse(f.read_text(encoding="utf-8")))
        if name == "numpy_ref" or name.startswith("numpy_ref.")
    ]
    assert not offenders, f"conformance/naive must not import numpy_ref: {offenders}"


def _code_names(tree):
    """Identifiers, imported names and string constants, docstrings left out."""
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.alias):
            yield node.name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.value


def test_the_naive_core_never_names_a_scheme_REL_3():
    """Only schemes/ (the registry and one module per scheme) knows a scheme; the core dispatches on none."""
    for f in sorted(NAIVE_DIR.rglob("*.py")):
        rel = f.relative_to(NAIVE_DIR)
        if rel.parts[0] == "schemes":
            continue
        names = list(_code_names(ast.parse(f.read_text(encoding="utf-8"))))
        assert "isinstance" not in names, rel
        assert not [n for n in names if "shaw" in n.lower() or "huang" in n.lower()], rel


# ------------------------------------------------------------------ the other two hook kinds
class _ToyBias(NaiveScheme):
    """bias hook: term[b, h, i, j] = -rel_b[h] * |delta[b, i, j]| (an ALiBi with a learnt slope)."""

    name = "toy-bias"

    def bias(self, scheme, P, params, num_heads, q_positions, k_positions, delta):
        return P.rnd(-params["rel_b"][None, :, None, None] * np.abs(delta)[:, None])

    def bias_vjp(self, scheme, P, params, num_heads, q_positions, k_positions, delta, grad):
        return {"rel_b": P.rnd(-(grad * np.abs(delta)[:, None]).sum(axis=(0, 2, 3)))}


class _ToyTransform(NaiveScheme):
    """qk_transform hook: q -> 2 q, k unchanged (the same as doubling the logit scale)."""

    name = "toy-qk"

    def qk_transform(self, scheme, P, q, k, q_positions, k_positions):
        return P.rnd(2 * q), k

    def qk_transform_vjp(self, scheme, P, dq, dk, q_positions, k_positions):
        return P.rnd(2 * dq), dk


def _toy_call(seed=0):
    base = AttentionSpec(num_heads=2, head_dim=3, causal=True)
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(base, seed=seed)
    inputs = {
        "query": rng.normal(size=(2, 3, 6)),
        "key": rng.normal(size=(2, 4, 6)),
        "value": rng.normal(size=(2, 4, 6)),
        "q_positions": np.array([1, 2, 3]),
    }
    return base, params, inputs, rng.normal(size=(2, 3, 6))


def _with_scheme(base, scheme):
    """A stand-in spec carrying a test-only scheme (AttentionSpec accepts registered schemes only)."""
    fields = ("num_heads", "head_dim", "bias", "causal", "mask_fill", "dropout", "effective_scale", "relative_scale")
    fields += ("kv_heads", "group_size", "v_head_dim", "softcap", "window")
    return types.SimpleNamespace(**{f: getattr(base, f) for f in fields}, relative=scheme)


@pytest.mark.parametrize("order", ORDERS)
def test_the_bias_hook_acts_as_the_bias_input(order, monkeypatch):
    monkeypatch.setitem(schemes_base._REGISTRY, "toy-bias", _ToyBias())
    base, params, inputs, g = _toy_call()
    slopes = np.array([0.5, 0.25])
    toy = _with_scheme(base, types.SimpleNamespace(name="toy-bias", hooks=frozenset({"bias"})))
    out, w, cache = forward(toy, {**params, "rel_b": slopes}, inputs, "float64", order)
    grads = backward(toy, cache, g, order)
    delta = np.abs(np.array([0, 1, 2, 3])[None, :] - np.array([1, 2, 3])[:, None])  # (Lq, Lk)
    bias = -slopes[:, None, None] * delta  # (H, Lq, Lk)
    kw = {"q_positions": inputs["q_positions"], "bias": bias}
    ref_out, ref_w = numpy_ref.attention(
        base, params, inputs["query"], inputs["key"], inputs["value"], **kw, return_weights=True
    )
    ref = numpy_ref.attention_vjp(base, params, inputs["query"], inputs["key"], inputs["value"], g, **kw)
    np.testing.assert_allclose(out, ref_out, atol=1e-12, rtol=0)
    np.testing.assert_allclose(w, ref_w, atol=1e-12, rtol=0)
    np.testing.assert_allclose(grads["rel_b"], -(ref["bias"] * delta).sum(axis=(1, 2)), atol=1e-11, rtol=0)
    for name in params:
        np.testing.assert_allclose(grads[name], ref[name], atol=1e-11, rtol=0, err_msg=name)


@pytest.mark.parametrize("order", ORDERS)
def test_the_qk_transform_hook_runs_before_the_scale(order, monkeypatch):
    monkeypatch.setitem(schemes_base._REGISTRY, "toy-qk", _ToyTransform())
    base, params, inputs, g = _toy_call(1)
    toy = _with_scheme(base, types.SimpleNamespace(name="toy-qk", hooks=frozenset({"qk_transform"})))
    out, w, cache = forward(toy, params, inputs, "float64", order)
    grads = backward(toy, cache, g, order)
    doubled = AttentionSpec(num_heads=2, head_dim=3, causal=True, scale=2 * base.effective_scale)
    args = (doubled, params, inputs["query"], inputs["key"], inputs["value"])
    ref_out, ref_w = numpy_ref.attention(*args, q_positions=inputs["q_positions"], return_weights=True)
    ref = numpy_ref.attention_vjp(*args, g, q_positions=inputs["q_positions"])
    np.testing.assert_allclose(out, ref_out, atol=1e-12, rtol=0)
    np.testing.assert_allclose(w, ref_w, atol=1e-12, rtol=0)
    assert sorted(grads) == sorted(ref)
    for name in ref:
        np.testing.assert_allclose(grads[name], ref[name], atol=1e-11, rtol=0, err_msg=name)
