"""The scheme hook protocol of numpy_ref (REL-3, REL-4), through a test-only scheme.

``ToyBiasRotate`` uses the two hooks no built-in scheme uses yet: a q/k
transform (channel pairs (2c, 2c+1) of q and k rotated by ``theta * position``,
a RoPE in miniature) and a bias (``-rel_slope[h] * |delta|``, an ALiBi in
miniature). This file is also its numpy_ref module: the hook functions below
are registered with ``numpy_ref.schemes.register_module``. Registration in
``spec`` is process-global: the names are unique, the module fixture
registers only what is not registered yet, and it removes what it added
when this file's tests are done, so no other test sees the toy schemes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import pytest
from _random_calls import random_call

import numpy_ref
import spec
from numpy_ref import schemes
from spec import AttentionSpec, Huang, Scheme, Shaw

TOY = "toy-bias-rotate"
UNBOUND = "toy-without-numpy-module"


@dataclass(frozen=True)
class ToyBiasRotate(Scheme):  # registered by the `registered` fixture below
    """Rotate q and k by theta * position per channel pair; add -rel_slope[h] * |delta| (REL-3 hooks 1 and 3)."""

    name = TOY
    rule_prefix = "REL"

    theta: float = 0.5

    def param_shapes(self, num_heads, head_dim, value_head_dim):
        return {"rel_slope": (num_heads,)}

    @property
    def hooks(self):
        return frozenset({"qk_transform", "bias"})

    @property
    def features(self):
        return frozenset({TOY})


@dataclass(frozen=True)
class Unbound(Scheme):
    """A scheme known to ``spec`` with no numpy_ref module; ``uses`` lists the hooks it claims."""

    name = UNBOUND
    rule_prefix = "REL"

    uses: tuple = ()

    def param_shapes(self, num_heads, head_dim, value_head_dim):
        return {}

    @property
    def hooks(self):
        return frozenset(self.uses)

    @property
    def features(self):
        return frozenset()


@pytest.fixture(autouse=True, scope="module")
def registered():
    """Register the toy schemes in spec and the toy's module in numpy_ref; undo exactly that afterwards."""
    added_spec = [cls for cls in (ToyBiasRotate, Unbound) if cls.name not in spec.scheme_classes()]
    for cls in added_spec:
        spec.register(cls)
    added_module = TOY not in schemes.REGISTRY
    if added_module:
        schemes.register_module(TOY, sys.modules[__name__])
    yield
    for cls in added_spec:
        spec.unregister(cls.name)
    if added_module:
        schemes.REGISTRY.pop(TOY, None)


# --------------------------------------------------------- the toy's numpy_ref hooks
def _rotate(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """x (B, H, L, d), pos (1|B, L): pairs (2c, 2c+1) rotated by theta * pos; an odd last channel stays."""
    n = x.shape[-1] // 2
    a = theta * pos[:, None, :, None].astype(np.float64)  # (1|B, 1, L, 1)
    c, s = np.cos(a), np.sin(a)
    x0, x1 = x[..., 0 : 2 * n : 2], x[..., 1 : 2 * n : 2]
    out = x.copy()
    out[..., 0 : 2 * n : 2] = x0 * c - x1 * s
    out[..., 1 : 2 * n : 2] = x0 * s + x1 * c
    return out


def qk_transform(scheme, params, q, k, ctx):
    return _rotate(q, ctx.q_positions, scheme.theta), _rotate(k, ctx.k_positions, scheme.theta), ctx


def qk_transform_vjp(scheme, params, ctx, dq, dk):
    # a rotation's adjoint is the rotation by the opposite angle
    return _rotate(dq, ctx.q_positions, -scheme.theta), _rotate(dk, ctx.k_positions, -scheme.theta), {}


def bias(scheme, params, ctx):
    return -params["rel_slope"][None, :, None, None] * np.abs(ctx.delta)[:, None], ctx  # (1|B, H, Lq, Lk)


def bias_vjp(scheme, params, ctx, g):
    return {"rel_slope": -(g * np.abs(ctx.delta)[:, None]).sum(axis=(0, 2, 3))}


def _literal_rotate(scheme, vec, pos):
    a = scheme.theta * pos
    out = list(vec)
    for c in range(len(vec) // 2):
        x0, x1 = vec[2 * c], vec[2 * c + 1]
        out[2 * c], out[2 * c + 1] = x0 * math.cos(a) - x1 * math.sin(a), x0 * math.sin(a) + x1 * math.cos(a)
    return out


def literal_q(scheme, params, h, q_vec, q_pos):
    return _literal_rotate(scheme, q_vec, q_pos)


def literal_k(scheme, params, h, k_vec, k_pos):
    return _literal_rotate(scheme, k_vec, k_pos)


def literal_bias(scheme, params, h, num_heads, q_pos, k_pos):
    return -float(params["rel_slope"][h]) * abs(k_pos - q_pos)


# ------------------------------------------------------------------------- helpers
def _plain(s: AttentionSpec) -> AttentionSpec:
    return replace(s, relative=None)


def _without_tables(params):
    return {n: a for n, a in params.items() if not n.startswith("rel_")}


def _alibi_bias(slope, q_positions, k_positions):
    """-slope[h] * |k_pos - q_pos|, (1, H, Lq, Lk), written out directly from the positions."""
    dist = np.abs(np.asarray(k_positions)[None, :] - np.asarray(q_positions)[:, None])
    return -np.asarray(slope)[None, :, None, None] * dist[None, None]


# --------------------------------------------------------------------------- tests
def test_rel3_hand_derived_rotation_and_bias():
    # H = 1, d = 2, scale 1, theta = pi/2, rel_slope = ln 2, identity projections.
    # x0 = [1, 0] at position 0, x1 = [0, 1] at position 1. Rotated: q0 = k0 = [1, 0],
    # q1 = k1 = R(pi/2) [0, 1] = [-1, 0]. Content logits: query 0 [1, -1], query 1 [-1, 1].
    # Bias -ln2 |delta|: query 0 [0, -ln 2], query 1 [-ln 2, 0]. Query 0: exp(1) : exp(-1)/2
    # = 2e^2 : 1; query 1 mirrored. Values are not rotated: o0 = [2e^2, 1] / (2e^2 + 1), o1 mirrored.
    s = AttentionSpec(num_heads=1, head_dim=2, scale=1.0, relative=ToyBiasRotate(theta=math.pi / 2))
    p = numpy_ref.identity_params(s)
    p["rel_slope"] = np.array([math.log(2)])
    x = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    out, w = numpy_ref.attention(s, p, x, return_weights=True)
    a = 2 * math.e**2
    expected = np.array([[a, 1.0], [1.0, a]]) / (a + 1)
    np.testing.assert_allclose(w[0, 0], expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(out[0], expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_rel3_bias_hook_equals_the_explicit_bias_input(seed):
    """theta = 0 (no rotation): the scheme equals plain attention given -slope |delta| as ``bias`` (BIAS-1)."""
    rng = np.random.default_rng(seed)
    s = AttentionSpec(2, 2, relative=ToyBiasRotate(theta=0.0), causal=bool(seed % 2))
    p = numpy_ref.init_params(s, seed)
    B, Lq, Lk = 2, 3, 4
    xq, xk, xv = rng.normal(size=(B, Lq, 4)), rng.normal(size=(B, Lk, 4)), rng.normal(size=(B, Lk, 4))
    qp, kp = rng.integers(-5, 6, size=Lq), rng.integers(-5, 6, size=Lk)
    mask = rng.random((B, 1, Lq, Lk)) < 0.8
    kw = {"mask": mask, "q_positions": qp, "k_positions": kp}
    out, w = numpy_ref.attention(s, p, xq, xk, xv, **kw, return_weights=True)
    b = _alibi_bias(p["rel_slope"], qp, kp)
    out_b, w_b = numpy_ref.attention(_plain(s), _without_tables(p), xq, xk, xv, **kw, bias=b, return_weights=True)
    np.testing.assert_allclose(w, w_b, rtol=0, atol=1e-14)
    np.testing.assert_allclose(out, out_b, rtol=0, atol=1e-14)
    # the slope's gradient is the bias input's gradient contracted with -|delta|
    g = rng.normal(size=out.shape)
    grads = numpy_ref.attention_vjp(s, p, xq, xk, xv, g, **kw)
    grads_b = numpy_ref.attention_vjp(_plain(s), _without_tables(p), xq, xk, xv, g, **kw, bias=b)
    expected_slope = -(grads_b["bias"][0] * np.abs(kp[None, :] - qp[:, None])).sum(axis=(1, 2))
    np.testing.assert_allclose(grads["rel_slope"], expected_slope, rtol=1e-12, atol=1e-14)
    for name in ("query", "key", "value", "wq", "wk", "wv", "wo"):
        np.testing.assert_allclose(grads[name], grads_b[name], rtol=0, atol=1e-13, err_msg=name)


def _rotation_matrix(theta, pos, H, d):
    """The (D, D) block-diagonal matrix M with rotate(x) = x @ M per head, at one position."""
    c, s = math.cos(theta * pos), math.sin(theta * pos)
    block = np.eye(d)
    for n in range(d // 2):
        block[2 * n : 2 * n + 2, 2 * n : 2 * n + 2] = [[c, s], [-s, c]]
    return np.kron(np.eye(H), block)


@pytest.mark.parametrize("d", [2, 3, 4])
def test_rel3_qk_transform_equals_rotated_projections(d):
    """All queries at one position and all keys at another: the rotation folds into wq, bq, wk, bk."""
    H, theta, qpos, kpos = 2, 0.7, 3, -2
    s = AttentionSpec(H, d, relative=ToyBiasRotate(theta=theta))
    p = numpy_ref.init_params(s, d)
    p["rel_slope"] = np.zeros(H)  # no bias: only the q/k transform acts
    rng = np.random.default_rng(d)
    B, Lq, Lk, D = 2, 3, 4, H * d
    xq, xk, xv = rng.normal(size=(B, Lq, D)), rng.normal(size=(B, Lk, D)), rng.normal(size=(B, Lk, D))
    kw = {"q_positions": np.full(Lq, qpos), "k_positions": np.full(Lk, kpos)}
    out, w = numpy_ref.attention(s, p, xq, xk, xv, **kw, return_weights=True)
    mq, mk = _rotation_matrix(theta, qpos, H, d), _rotation_matrix(theta, kpos, H, d)
    folded = _without_tables(p)
    folded.update(wq=p["wq"] @ mq, bq=p["bq"] @ mq, wk=p["wk"] @ mk, bk=p["bk"] @ mk)
    out_f, w_f = numpy_ref.attention(_plain(s), folded, xq, xk, xv, **kw, return_weights=True)
    np.testing.assert_allclose(w, w_f, rtol=0, atol=1e-13)
    np.testing.assert_allclose(out, out_f, rtol=0, atol=1e-13)
    g = rng.normal(size=out.shape)
    grads = numpy_ref.attention_vjp(s, p, xq, xk, xv, g, **kw)
    grads_f = numpy_ref.attention_vjp(_plain(s), folded, xq, xk, xv, g, **kw)
    for name in ("query", "key", "value", "wv", "wo"):
        np.testing.assert_allclose(grads[name], grads_f[name], rtol=0, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(grads["wq"], grads_f["wq"] @ mq.T, rtol=0, atol=1e-12)  # wq' = wq @ M


# AttentionSpec checks its scheme against spec's registry, so the specs are built inside the tests.
TOY_SPECS = {
    "even-d": dict(num_heads=2, head_dim=2, relative=ToyBiasRotate(theta=0.9)),
    "odd-d-causal": dict(num_heads=1, head_dim=3, relative=ToyBiasRotate(theta=-1.3), causal=True),
    "mask-fill-no-bias": dict(num_heads=2, head_dim=4, bias=False, relative=ToyBiasRotate(), mask_fill=-30.0),
    "dropout-unscaled": dict(num_heads=2, head_dim=2, relative=ToyBiasRotate(), scale_relative=False, dropout=0.3),
}


@pytest.mark.parametrize("name", list(TOY_SPECS))
@pytest.mark.parametrize("seed", range(5))
def test_rel3_toy_reference_matches_the_loop_definition(name, seed):
    """The generic hook calls of forward.py and of definition.py (literal hooks) agree (REL-3)."""
    call = random_call(seed, spec=AttentionSpec(**TOY_SPECS[name]), max_len=5)
    out, w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
    out_d, w_d = numpy_ref.definition.attention(*call.args(), **call.kwargs, return_weights=True)
    np.testing.assert_allclose(w, w_d, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out, out_d, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(TOY_SPECS))
def test_grad1_toy_vjp_equals_central_differences(name):
    """Every entry of every gradient, rel_slope included, against central differences (GRAD-1)."""
    s, eps = AttentionSpec(**TOY_SPECS[name]), 1e-6
    call = random_call(11, spec=s, cross=True, max_len=4)
    rng = np.random.default_rng(3)
    B, Lq, Lk = call.query.shape[0], call.query.shape[1], call.key.shape[1]
    kw = {
        "q_positions": rng.integers(-4, 5, size=(B, Lq)),
        "k_positions": rng.integers(-4, 5, size=Lk),
        "bias": rng.normal(size=(1, Lq, Lk)),
        "mask": rng.random((B, 1, 1, Lk)) < 0.8,
    }
    if s.dropout > 0:
        kw["dropout_keep"] = rng.random((B, s.num_heads, Lq, Lk)) > s.dropout
    g = rng.normal(size=call.query.shape)
    args = {"query": call.query, "key": call.key.copy(), "value": call.value.copy(), "bias": kw["bias"], **call.params}
    grads = numpy_ref.attention_vjp(s, call.params, args["query"], args["key"], args["value"], g, **kw)

    def objective(name, arr):
        a = {**args, name: arr}
        out = numpy_ref.attention(
            s, {n: a[n] for n in call.params}, a["query"], a["key"], a["value"], **{**kw, "bias": a["bias"]}
        )
        return float(np.sum(out * g))

    for arg_name, arr in args.items():
        fd = np.zeros(arr.shape)
        for idx in np.ndindex(arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += eps
            minus[idx] -= eps
            fd[idx] = (objective(arg_name, plus) - objective(arg_name, minus)) / (2 * eps)
        assert grads[arg_name].shape == arr.shape, arg_name
        np.testing.assert_allclose(grads[arg_name], fd, rtol=1e-6, atol=1e-7, err_msg=arg_name)


# ------------------------------------------------------------------ registry and errors
@pytest.mark.parametrize(
    "relative,kinds",
    [
        (None, ()),
        (Shaw(2), ("key_term", "value_term")),
        (Shaw(2, keys=False), ("value_term",)),
        (Shaw(2, values=False), ("key_term",)),
        (Huang(3), ("key_term",)),
        (Huang(3, values=True), ("key_term", "value_term")),
        (Shaw(2, key_side="shared"), ("key_term", "key_side_term", "value_term")),
        (Shaw(2, keys=False, values=False, key_side="own"), ("key_side_term",)),
        (ToyBiasRotate(), ("qk_transform", "bias")),
    ],
)
def test_rel3_bind_applies_the_schemes_hooks_in_hook_order(relative, kinds):
    bound = schemes.bind(relative)
    assert bound.kinds == kinds
    assert [k for k in spec.HOOKS if bound.uses(k)] == list(kinds)


def test_rel4_builtin_schemes_have_their_own_modules():
    assert schemes.module_for(Shaw(1)).__name__ == "numpy_ref.schemes.shaw"
    assert schemes.module_for(Huang(1)).__name__ == "numpy_ref.schemes.huang"
    assert schemes.module_for(ToyBiasRotate()) is sys.modules[__name__]


UNBOUND_MESSAGE = (
    r"spec\.relative: expected a scheme numpy_ref implements \(one of \[.*'huang'.*'shaw'.*\]; "
    r"add one with numpy_ref\.schemes\.register_module\(name, module\)\), "
    rf"got '{UNBOUND}' \(Unbound\)"
)


@pytest.mark.parametrize("entry", ["attention", "attention_vjp", "definition"])
def test_rel4_a_scheme_without_a_numpy_module_is_a_value_error(entry):
    s = AttentionSpec(1, 2, relative=Unbound(uses=("bias",)))
    p = numpy_ref.init_params(s, 0)
    x = np.zeros((1, 2, 2))
    call = {
        "attention": lambda: numpy_ref.attention(s, p, x),
        "attention_vjp": lambda: numpy_ref.attention_vjp(s, p, x, x, x, x),
        "definition": lambda: numpy_ref.definition.attention(s, p, x),
    }[entry]
    with pytest.raises(ValueError, match=UNBOUND_MESSAGE):
        call()


def test_rel4_module_for_names_the_registered_schemes():
    with pytest.raises(ValueError, match=r"one of \[.*'huang'.*'shaw'.*\].*got 'no-such-scheme' \(SimpleNamespace\)"):
        schemes.module_for(SimpleNamespace(name="no-such-scheme"))


def test_rel3_a_module_missing_a_hook_it_needs_is_a_value_error(monkeypatch):
    module = SimpleNamespace(__name__="partial_module", bias=bias)  # no bias_vjp, no literal_bias
    monkeypatch.setitem(schemes.REGISTRY, UNBOUND, module)
    with pytest.raises(
        ValueError,
        match=r"partial_module: expected the functions \['bias_vjp'\] for the hooks "
        rf"\['bias'\] of scheme '{UNBOUND}'",
    ):
        schemes.bind(Unbound(uses=("bias",)))
    with pytest.raises(ValueError, match=r"expected the functions \['literal_bias'\]"):
        schemes.bind(Unbound(uses=("bias",)), literal=True)


def test_rel3_an_unknown_hook_kind_is_a_value_error(monkeypatch):
    monkeypatch.setitem(schemes.REGISTRY, UNBOUND, SimpleNamespace(__name__="m"))
    with pytest.raises(ValueError, match=rf"{UNBOUND}\.hooks: expected hook kinds from .*, got \['logit_cap'\]"):
        schemes.bind(Unbound(uses=("bias", "logit_cap")))


def test_rel4_register_module_is_idempotent_and_keeps_names_apart():
    schemes.register_module(TOY, sys.modules[__name__])  # the same module again: no-op
    assert schemes.module_for(ToyBiasRotate()) is sys.modules[__name__]
    with pytest.raises(
        ValueError,
        match=r"register_module: scheme name 'shaw' already has the module "
        r"numpy_ref\.schemes\.shaw",
    ):
        schemes.register_module("shaw", sys.modules[__name__])
