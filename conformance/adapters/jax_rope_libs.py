"""Two JAX rotations certified through the RoPE glue: keras-hub's ``RotaryEmbedding`` and Gemma's ``apply_rope``.

Each adapter turns a case's ``Rope`` into the library's own arguments when
the library can express it exactly, and hands ``_glue.jax_run`` a
``rotate(x, positions)`` that calls the library (ROPE-1..ROPE-9); the glue
does the rest of the attention from the spec, so a deviation these adapters
report is the library's rotation's. Axis legend (AXES-1): B, H, Lq, Lk, d;
r the rotated channels (ROPE-2), f_c the frequencies (ROPE-4).

What each library can express (half layout only, ROPE-3; nothing else):

- ``keras-hub-rope``: ``keras_hub.layers.RotaryEmbedding(max_wavelength,
  scaling_factor, rope_type, ...)`` on the JAX backend. It rotates the whole
  feature axis it is given, frequencies over that size, so r < d is the
  layer on ``x[..., :r]`` with the other channels passed through (what
  keras-hub's own GPT-NeoX attention does). ``rope_type="linear"`` divides
  every frequency by ``scaling_factor`` (``Rope.linear``, ROPE-12); a
  ``Rope.ntk`` (ROPE-13) is the same layer with the base
  ``theta * alpha ** (r / (r - 2))``; ``rope_type="yarn"`` is ``Rope.yarn``
  (ROPE-14) with its attention factor ``0.1 ln(factor) + 1`` on cos and sin
  (ROPE-7). No explicit frequencies (there is no frequency buffer: they are
  recomputed in every call), so ``Rope.llama3`` and ``Rope.proportional``
  are not expressible. Positions go in as ``positions=`` (POS-1).
- ``gemma-rope``: ``apply_rope(inputs, positions, base_frequency,
  scale_factor, rope_proportion)`` of google-deepmind's ``gemma`` (in
  ``gemma/gm/math/_positional_embeddings.py``). It pairs over the whole
  head (r = d); ``rope_proportion`` is ``Rope.proportional`` (ROPE-16),
  ``scale_factor >= 1`` is ``Rope.linear``, a changed ``base_frequency`` is
  ``Rope.ntk``. No attention factor, no rotation of fewer channels than the
  head has.

Precision as a user runs them: the keras layer gets the case's dtype as its
dtype policy (``dtype="bfloat16"`` ...), which keeps its frequencies and
positions in float32 and rounds cos and sin to the compute dtype; Gemma's
function computes in float32 and casts its result to the input's dtype.
Both make float32 angles for float64 inputs too (ROPE-9; the deviations
``*-float64-angles-in-float32``). float16 runs on CPU: the glue is not
jitted, so the float16 dot that jax cannot jit on CPU never forms.

Both libraries pull in TensorFlow through their requirements (keras-hub's
tensorflow-text, gemma's kauldron), so they install with ``--no-deps``;
without kauldron, ``gemma.gm.math`` cannot be imported and the installed
file that defines ``apply_rope`` (it imports only jax) is loaded alone.

A case that needs what the library cannot express is named by
``unsupported_case(case)`` (and ``forward`` / ``vjp`` raise
``NotImplementedError`` with the same reason).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from typing import Optional

from spec import Rope

from . import _glue, _jax
from .base import Capabilities

#: how close (relative) a library argument's frequencies must come to the case's, in float64, to count
#: as the same Rope: the arguments are solved from the frequencies, so only float64 rounding may differ
SAME_FREQUENCIES = 1e-12
#: keras-hub's YaRN takes its parameters, not its frequencies: the solved beta_fast and beta_slow put
#: the correction dimensions this far inside the integers that truncation rounds them to
_YARN_MARGIN = 0.25
_YARN_ORIGINAL_MAX_POSITIONS = 4096

KERAS_INSTALL = "pip install keras==3.15.1 && pip install --no-deps keras-hub==0.32.0"
GEMMA_INSTALL = "pip install --no-deps gemma==3.3.0"


# ---------------------------------------------------------------------- fits
def _close(got, want) -> bool:
    return len(got) == len(want) and all(
        abs(g - w) <= SAME_FREQUENCIES * max(abs(w), 1e-300) for g, w in zip(got, want)
    )


def _bases(rope: Rope, freqs: tuple, over: int) -> list:
    """Candidate bases theta' with f_c proportional to theta' ** (-2c / over): the Rope's own, then the fitted one."""
    out = [rope.theta]
    if len(freqs) >= 2 and freqs[0] > 0 and freqs[1] > 0:
        out.append((freqs[0] / freqs[1]) ** (over / 2))
    return out


def geometric_form(rope: Rope, head_dim: int, over: int, turning: int) -> Optional[tuple]:
    """(theta', s) with f_c = theta' ** (-2c / over) / s for c < turning and f_c = 0 after, or None.

    ROPE-4, ROPE-12, ROPE-13: the plain, the linearly scaled and the NTK-scaled frequencies are all of
    this form (NTK as a changed base), so a library with a base and a uniform divisor expresses them.
    """
    freqs = rope.frequencies(head_dim)
    if turning < 1 or freqs[0] <= 0:
        return None
    s = 1.0 / freqs[0]
    for theta in _bases(rope, freqs, over):
        if not (math.isfinite(theta) and theta > 1.0):
            continue
        want = [theta ** (-2 * c / over) / s if c < turning else 0.0 for c in range(len(freqs))]
        if _close(freqs, want):
            return theta, s
    return None


def yarn_form(rope: Rope, head_dim: int) -> Optional[dict]:
    """keras-hub ``rope_type="yarn"`` arguments whose ``Rope.yarn`` is the case's Rope (ROPE-14), or None.

    The frequencies give the factor (the ratio of the last, fully interpolated pair) and the ramp; with
    truncation the ramp ends are integers, found by trying each; beta_fast and beta_slow are then solved
    from ROPE-14's correction dimension for an original length of 4096, a quarter inside those integers.
    The attention factor must be keras-hub's, 0.1 ln(factor) + 1.
    """
    r = rope.rotated(head_dim)
    freqs = rope.frequencies(head_dim)
    base = [rope.theta ** (-2 * c / r) for c in range(r // 2)]
    ratios = [f / b for f, b in zip(freqs, base)]
    if min(ratios) <= 0 or max(ratios) > 1.0 + SAME_FREQUENCIES or len(freqs) < 2:
        return None
    factor = 1.0 / ratios[-1]
    if not factor > 1.0 or not math.isclose(rope.attention_factor, 0.1 * math.log(factor) + 1.0, rel_tol=1e-12):
        return None
    n = _YARN_ORIGINAL_MAX_POSITIONS

    def beta(dim: float) -> float:  # the inverse of ROPE-14's corr(b) = r ln(n / (2 pi b)) / (2 ln theta)
        return n / (2 * math.pi) * rope.theta ** (-2 * dim / r)

    for low in range(0, r // 2 + 1):
        for high in range(low + 1, r):
            fast, slow = beta(low + _YARN_MARGIN), beta(high - _YARN_MARGIN)
            candidate = Rope.yarn(factor, n, fast, slow, True, rotary_dim=r, theta=rope.theta)
            if _close(freqs, candidate.inv_freq):
                return {
                    "max_wavelength": rope.theta,
                    "scaling_factor": factor,
                    "rope_type": "yarn",
                    "beta_fast": fast,
                    "beta_slow": slow,
                    "original_max_position_embeddings": n,
                    "truncate": True,
                }
    return None


def keras_hub_arguments(spec) -> tuple:
    """(RotaryEmbedding keyword arguments, r) for the spec's Rope, or (None, reason)."""
    rope = spec.relative
    if getattr(rope, "name", None) != "rope":  # REL-3: schemes are told apart by name
        return None, f"keras-hub-rope certifies RoPE only (spec.relative is {type(rope).__name__}, not a Rope)"
    if rope.layout != "half":
        return None, "RotaryEmbedding pairs the two halves of the feature axis (ROPE-3 half layout) only"
    d = spec.head_dim
    r = rope.rotated(d)
    if rope.attention_factor == 1.0:
        form = geometric_form(rope, d, r, r // 2)
        if form is not None:
            theta, s = form
            return {"max_wavelength": theta, "scaling_factor": s, "rope_type": "linear"}, r
    yarn = yarn_form(rope, d)
    if yarn is not None:
        return yarn, r
    if rope.attention_factor != 1.0:
        return None, (
            f"RotaryEmbedding's only attention factor is YaRN's 0.1 ln(factor) + 1 with YaRN's frequencies; "
            f"the case has attention_factor={rope.attention_factor!r} with other frequencies (ROPE-7)"
        )
    return None, (
        "RotaryEmbedding takes a base, a uniform divisor (linear) or YaRN's parameters, not explicit "
        f"frequencies; the case's {list(rope.frequencies(d))} are none of these (ROPE-4)"
    )


def gemma_arguments(spec) -> tuple:
    """(apply_rope keyword arguments, None) for the spec's Rope, or (None, reason)."""
    rope = spec.relative
    if getattr(rope, "name", None) != "rope":
        return None, f"gemma-rope certifies RoPE only (spec.relative is {type(rope).__name__}, not a Rope)"
    if rope.layout != "half":
        return None, "apply_rope splits the head into two halves (ROPE-3 half layout) only"
    d = spec.head_dim
    if rope.rotated(d) != d:
        return None, (
            f"apply_rope pairs over the whole head (r = d = {d}); the case rotates r = {rope.rotated(d)} "
            "channels with frequencies over r (ROPE-2)"
        )
    if rope.attention_factor != 1.0:
        return None, "apply_rope has no attention factor (ROPE-7)"
    freqs = rope.frequencies(d)
    turning = next((c for c, f in enumerate(freqs) if f == 0.0), len(freqs))
    proportion = 2 * turning / d
    if any(f != 0.0 for f in freqs[turning:]) or int(proportion * d // 2) != turning:
        return None, f"apply_rope's frequencies are non-zero then zero (rope_proportion); the case's are {list(freqs)}"
    form = geometric_form(rope, d, d, turning)
    if form is None:
        return None, (
            "apply_rope takes a base, a scale_factor and a rope_proportion, not explicit frequencies; "
            f"the case's {list(freqs)} are not of that form (ROPE-4)"
        )
    theta, s = form
    if s < 1.0:
        return None, f"apply_rope rejects scale_factor < 1; the case's frequencies need {s!r} (ROPE-12)"
    return {"base_frequency": theta, "scale_factor": s, "rope_proportion": proportion}, None


# ------------------------------------------------------------------ imports
def _keras_backend_problem() -> Optional[str]:
    """Why keras cannot run on JAX in this process, or None (KERAS_BACKEND=jax is set when keras is not loaded)."""
    if "keras" in sys.modules:
        backend = sys.modules["keras"].backend.backend()
        if backend != "jax":
            return (
                f"keras was already imported with the {backend!r} backend; keras-hub-rope needs the JAX backend: "
                "set KERAS_BACKEND=jax before keras is first imported"
            )
        return None
    chosen = os.environ.get("KERAS_BACKEND")
    if chosen not in (None, "jax"):
        return f"KERAS_BACKEND={chosen!r}; keras-hub-rope needs KERAS_BACKEND=jax (set before keras is first imported)"
    os.environ["KERAS_BACKEND"] = "jax"
    return None


def keras_hub_unavailable() -> Optional[str]:
    """Why keras-hub cannot run on JAX here (JAX, the keras backend, the package), or None."""
    reason = _jax.jax_available() or _keras_backend_problem()
    if reason:
        return reason
    try:
        import keras_hub  # noqa: F401
    except ImportError as e:
        return f"keras-hub is not installed ({e}); {KERAS_INSTALL} (its tensorflow-text requirement pulls TensorFlow)"
    return None


def keras_hub_environment() -> dict:
    import keras
    import keras_hub

    return {"keras": keras.__version__, "keras_hub": keras_hub.__version__, "keras_backend": keras.backend.backend()}


def _gemma_rope():
    """(apply_rope, where it came from).

    ``from gemma.gm.math import apply_rope`` needs kauldron (and through it TensorFlow); without it the
    same installed file, gemma/gm/math/_positional_embeddings.py (it imports only jax), is loaded alone.
    """
    try:
        from gemma.gm.math import apply_rope

        return apply_rope, "gemma.gm.math.apply_rope"
    except ModuleNotFoundError as e:
        if e.name in ("gemma", "gemma.gm", "gemma.gm.math"):
            raise
    found = importlib.util.find_spec("gemma")
    path = os.path.join(found.submodule_search_locations[0], "gm", "math", "_positional_embeddings.py")
    if not os.path.exists(path):
        raise ModuleNotFoundError(f"gemma is installed without {path}", name="gemma")
    loaded = importlib.util.spec_from_file_location("gemma_gm_math_positional_embeddings", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module.apply_rope, "gemma/gm/math/_positional_embeddings.py (loaded alone: kauldron is not installed)"


# ----------------------------------------------------------------- adapters
#: Why the glue's cases beyond a rotation are not run (float16 runs on CPU too: the glue is not jitted,
#: so the F16_F16_F32 dot that jax cannot jit on CPU never forms).
GLUE_NOTES = {
    "softcap": "the glue's core has no soft cap (SOFTCAP-1)",
    "window": "the glue's core has no window (WINDOW-1)",
    "mask-fill": "the glue's core gives disallowed keys weight 0 (MASK-5), no fill value",
    "dropout-spec": "the glue drops out through explicit keep masks only (DROP-1)",
    "validates-input": "the library's rotation is not an attention entry point (INPUT-1)",
}


def _jitted(rotate, as_positions):
    """``rotate`` compiled as one program (as a user's jitted model runs it), positions converted first."""
    import jax

    compiled = jax.jit(rotate)
    return lambda x, positions: compiled(x, as_positions(positions))


class _RopeLibAdapter(_jax.JaxAdapter):
    """The shared part: capabilities from the glue, a per-case reason, forward and vjp through ``jax_run``."""

    rope_features: frozenset = frozenset()
    missing_notes: dict = {}

    def arguments(self, spec) -> tuple:
        raise NotImplementedError

    def rotation(self, spec, arguments, extra):
        raise NotImplementedError

    def capabilities(self):
        self.environment()
        return Capabilities(
            devices=_jax.devices(),
            features=_glue.GLUE_FEATURES | self.rope_features,
            requires=_glue.ROPE_ONLY,
            notes={**GLUE_NOTES, **self.missing_notes},
        )

    def unsupported_case(self, case) -> Optional[str]:
        """Why this library cannot express the case's Rope, or None."""
        arguments, why = self.arguments(case.spec)
        return why if arguments is None else None

    def _rotate(self, spec):
        arguments, extra = self.arguments(spec)
        if arguments is None:
            raise NotImplementedError(f"{self.name}: {extra}")
        return self.rotation(spec, arguments, extra)

    def forward(self, spec, params, inputs, *, device, need_weights):
        return _glue.jax_run(spec, params, inputs, device, self._rotate(spec), need_weights=need_weights)

    def vjp(self, spec, params, inputs, grad_out, *, device):
        rotate = self._rotate(spec)
        return _glue.jax_run(spec, params, inputs, device, rotate, need_weights=False, grad_out=grad_out)


class KerasHubRopeAdapter(_RopeLibAdapter):
    name = "keras-hub-rope"
    description = "keras_hub.layers.RotaryEmbedding (JAX backend) + the RoPE glue"
    rope_features = frozenset({"rope", "rope-partial", "rope-attention-factor"})
    missing_notes = {
        "rope-interleaved": "RotaryEmbedding pairs the two halves of the feature axis only",
        "shaw": "a RoPE layer only",
        "huang": "a RoPE layer only",
    }

    def unavailable(self):
        return keras_hub_unavailable()

    def extra_environment(self):
        return keras_hub_environment()

    def arguments(self, spec):
        return keras_hub_arguments(spec)

    def rotation(self, spec, arguments, r):
        """ROPE-5 by RotaryEmbedding on the first r channels, in the case's dtype (its dtype policy)."""
        import jax.numpy as jnp
        import keras_hub

        def rotate(x, positions):  # x (B, heads, L, d), positions (1|B, L)
            layer = keras_hub.layers.RotaryEmbedding(
                **arguments, sequence_axis=2, feature_axis=-1, dtype=jnp.dtype(x.dtype).name
            )
            turned = layer(x[..., :r], positions=positions)
            return turned if r == x.shape[-1] else jnp.concatenate([turned, x[..., r:]], axis=-1)

        return _jitted(rotate, jnp.asarray)


class GemmaRopeAdapter(_RopeLibAdapter):
    name = "gemma-rope"
    description = "gemma.gm.math.apply_rope (google-deepmind gemma) + the RoPE glue"
    rope_features = frozenset({"rope", "rope-partial"})
    missing_notes = {
        "rope-interleaved": "apply_rope splits the head into two halves only",
        "rope-attention-factor": "apply_rope has no attention factor",
        "shaw": "a RoPE function only",
        "huang": "a RoPE function only",
    }

    def __init__(self):
        super().__init__()
        self._apply, self._source = None, None

    def unavailable(self):
        reason = _jax.jax_available()
        if reason:
            return reason
        try:
            self._apply, self._source = _gemma_rope()
        except ImportError as e:
            return f"gemma is not installed ({e}); {GEMMA_INSTALL} (its kauldron requirement pulls in TensorFlow)"
        return None

    def extra_environment(self):
        from importlib import metadata

        return {"gemma": metadata.version("gemma"), "gemma_apply_rope": self._source}

    def arguments(self, spec):
        return gemma_arguments(spec)

    def rotation(self, spec, arguments, extra):
        """ROPE-5 by apply_rope on (B, L, heads, d), positions as the int32 Gemma's own code passes."""
        import jax.numpy as jnp

        if self._apply is None:
            self._apply, self._source = _gemma_rope()
        apply_rope = self._apply

        def rotate(x, positions):  # x (B, heads, L, d), positions (1|B, L)
            return apply_rope(x.transpose(0, 2, 1, 3), positions, **arguments).transpose(0, 2, 1, 3)

        return _jitted(rotate, lambda p: jnp.asarray(p, dtype=jnp.int32))
