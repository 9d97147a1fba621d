"""The reference summing every contraction in another order (PREC-5, PREC-6): a member of the float64 battery."""

from dataclasses import replace

import numpy as np

from conformance.adapters.numpy_ref_adapter import NumpyRefAdapter


class _Reversed:
    """``permutation(n)`` as numpy's Generator has it, always n - 1 .. 0."""

    @staticmethod
    def permutation(n: int) -> np.ndarray:
        return np.arange(n)[::-1].copy()


class ReorderedReference(NumpyRefAdapter):
    """The reference summing every contraction in another order, as another machine's BLAS may.

    The model features (the D axis of the inputs and the rows of wq, wk, wv)
    and the channels inside each head (columns of wq, wk, wv and their
    biases, the columns of the tables, the rows of wo) are permuted
    consistently: the function is the same, every dot product adds its terms
    in another order.
    """

    name = "reordered-reference"

    def __init__(self, reverse: bool = False):
        self.reverse = reverse  # every order reversed instead of a random permutation
        if reverse:
            self.name = "reversed-reference"

    def forward(self, spec, params, inputs, *, device, need_weights):
        H, Hkv, d, dv, D = spec.num_heads, spec.kv_heads, spec.head_dim, spec.v_head_dim, spec.model_dim
        rng = _Reversed() if self.reverse else np.random.default_rng(7)
        features = rng.permutation(D)
        within = rng.permutation(d)  # one channel order for every query/key head and for rel_k
        within_v = rng.permutation(dv)  # and one for every value head and rel_v (HEAD-4)
        if spec.relative is not None and spec.relative.name == "rope":
            within, spec = self.rope_order(spec, rng)
        channels = {
            "q": np.concatenate([h * d + within for h in range(H)]),
            "k": np.concatenate([h * d + within for h in range(Hkv)]),  # HEAD-3
            "v": np.concatenate([h * dv + within_v for h in range(Hkv)]),
        }
        p = dict(params)
        for n, order in channels.items():
            p["w" + n] = params["w" + n][features][:, order]
            if "b" + n in p:
                p["b" + n] = params["b" + n][order]
        p["wo"] = params["wo"][np.concatenate([h * dv + within_v for h in range(H)])]
        for n, order in (("rel_k", within), ("rel_q", within), ("rel_v", within_v)):
            if n in p:
                p[n] = params[n][..., order]
        x = {n: (a[..., features] if n in ("query", "key", "value") else a) for n, a in inputs.items()}
        return super().forward(spec, p, x, device=device, need_weights=need_weights)

    @staticmethod
    def rope_order(spec, rng):
        """ROPE-3: pairs move as wholes (each keeps its frequency, so inv_freq is permuted with them) and
        the unrotated channels among themselves: the same layer, every q.k sum in another order."""
        rope, d = spec.relative, spec.head_dim
        r = rope.rotated(d)
        pairs = rng.permutation(r // 2)  # new pair c reads old pair pairs[c]
        if rope.layout == "half":
            rotated = np.concatenate([pairs, pairs + r // 2])
        else:
            rotated = np.stack([2 * pairs, 2 * pairs + 1], axis=1).ravel()
        within = np.concatenate([rotated, r + rng.permutation(d - r)])
        freqs = np.asarray(rope.frequencies(d))[pairs]
        return within, replace(spec, relative=replace(rope, rotary_dim=r, inv_freq=tuple(float(f) for f in freqs)))

    def capabilities(self):
        from conformance.adapters.base import FEATURES, Capabilities

        # the permutation indexes the parameters itself (it would slice a misshaped one): numbers only
        return Capabilities(dtypes=("float64",), gradients=False, features=FEATURES - {"validates-input"})
