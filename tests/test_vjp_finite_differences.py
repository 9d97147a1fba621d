"""attention_vjp equals central finite differences in float64 (GRAD-1).

Two strengths: element-by-element differences for every entry of every
returned gradient on hand-picked configurations, and directional differences
(a random direction per argument) over random configurations of every option.
"""

import numpy as np
import pytest
from _random_calls import random_call
from hypothesis import given
from hypothesis import strategies as st

import numpy_ref
from spec import AttentionSpec, Huang, Shaw

EPS = 1e-6


def differentiable_args(call, kwargs):
    args = {"query": call.query, "key": call.key, "value": call.value}
    if "bias" in kwargs:
        args["bias"] = kwargs["bias"]
    args.update(call.params)
    return args


def objective(call, kwargs, grad_out, replace):
    args = differentiable_args(call, kwargs)
    args.update(replace)
    params = {n: args[n] for n in call.params}
    kw = dict(kwargs)
    if "bias" in kw:
        kw["bias"] = args["bias"]
    out = numpy_ref.attention(call.spec, params, args["query"], args["key"], args["value"], **kw)
    return float(np.sum(out * grad_out))


def separate_inputs(call):
    """attention_vjp's query/key/value gradients are partials: give each its own array."""
    call.key = call.key.copy()
    call.value = call.value.copy()
    return call


def upstream(call, seed):
    return np.random.default_rng(seed).normal(size=call.query.shape)


ELEMENTWISE = {
    "vanilla": AttentionSpec(2, 2),
    "shaw-shared": AttentionSpec(2, 2, relative=Shaw(1)),
    "shaw-per-head-no-bias": AttentionSpec(2, 2, bias=False, relative=Shaw(2, per_head=True)),
    "huang-per-head-causal": AttentionSpec(2, 2, relative=Huang(2), causal=True),
    "huang-shared-unscaled": AttentionSpec(1, 3, relative=Huang(3, per_head=False), scale_relative=False),
    "shaw-key-side-shared-unscaled-side": AttentionSpec(
        2, 2, relative=Shaw(1, key_side="shared", key_side_scaled=False, per_head=True)
    ),
    "shaw-key-side-own-gqa": AttentionSpec(4, 2, num_kv_heads=2, relative=Shaw(2, values=False, key_side="own")),
    "huang-values-causal": AttentionSpec(2, 2, relative=Huang(2, values=True), causal=True),
    "mask-fill-dropout": AttentionSpec(2, 2, relative=Shaw(1), mask_fill=-4.0, dropout=0.25),
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_every_gradient_entry(name):
    spec = ELEMENTWISE[name]
    call = separate_inputs(random_call(11, spec=spec, cross=True))
    rng = np.random.default_rng(5)
    B, Lq, Lk = call.query.shape[0], call.query.shape[1], call.key.shape[1]
    kwargs = dict(call.kwargs)
    kwargs["bias"] = rng.normal(size=(1, Lq, Lk))
    kwargs["bias"][0, 0, 0] = -np.inf
    kwargs["mask"] = rng.random((B, 1, 1, Lk)) < 0.8
    kwargs["q_positions"] = np.arange(Lq) + 1  # bottom-right-ish offset
    if spec.dropout > 0:
        kwargs["dropout_keep"] = rng.random((B, spec.num_heads, Lq, Lk)) > spec.dropout
    else:
        kwargs.pop("dropout_keep", None)
    g = upstream(call, 1)
    grads = numpy_ref.attention_vjp(*call.args(), g, **kwargs)
    for arg_name, arr in differentiable_args(call, kwargs).items():
        fd = np.zeros(arr.shape)
        for idx in np.ndindex(arr.shape):
            if not np.isfinite(arr[idx]):
                continue  # a -inf bias entry: a constant (GRAD-2)
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += EPS
            minus[idx] -= EPS
            fd[idx] = (objective(call, kwargs, g, {arg_name: plus}) - objective(call, kwargs, g, {arg_name: minus})) / (
                2 * EPS
            )
        assert grads[arg_name].shape == arr.shape, arg_name
        np.testing.assert_allclose(grads[arg_name], fd, rtol=1e-6, atol=1e-7, err_msg=arg_name)


@given(st.integers(0, 2**32 - 1))
def test_directional_derivatives(seed):
    call = separate_inputs(random_call(seed))
    g = upstream(call, seed)
    grads = numpy_ref.attention_vjp(*call.args(), g, **call.kwargs)
    rng = np.random.default_rng(seed + 1)
    for arg_name, arr in differentiable_args(call, call.kwargs).items():
        direction = np.where(np.isfinite(arr), rng.normal(size=arr.shape), 0.0)
        base = np.where(np.isfinite(arr), arr, 0.0)
        inf_part = np.where(np.isfinite(arr), 0.0, arr)

        def f(t):
            return objective(call, call.kwargs, g, {arg_name: base + t * direction + inf_part})

        fd = (f(EPS) - f(-EPS)) / (2 * EPS)
        analytic = float(np.sum(np.where(np.isfinite(arr), grads[arg_name], 0.0) * direction))
        assert np.isfinite(grads[arg_name]).all(), arg_name
        assert abs(analytic - fd) <= 1e-6 * max(1.0, abs(fd)), (arg_name, analytic, fd)


def test_gradient_dict_names_and_order():
    spec = AttentionSpec(2, 2, relative=Shaw(1))
    call = separate_inputs(random_call(2, spec=spec, cross=True))
    Lq, Lk = call.query.shape[1], call.key.shape[1]
    grads = numpy_ref.attention_vjp(*call.args(), upstream(call, 0), bias=np.zeros((Lq, Lk)))
    assert list(grads) == ["query", "key", "value", "bias"] + list(spec.param_shapes())
    assert grads["bias"].shape == (Lq, Lk)
