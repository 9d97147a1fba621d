"""The vocabulary package: immutability, hashing, shapes, profiles, rule ids."""

import dataclasses
import math
import pathlib
import re

import pytest

import spec
from spec import SPEC_VERSION, AttentionSpec, Huang, Shaw, profiles

ROOT = pathlib.Path(__file__).resolve().parents[1]
RULE_REF = re.compile(
    r"\b(AXES|SHAPE|INPUT|PARAM|PROJ|HEAD|OUT|SCALE|POS|CAUSAL|MASK|BIAS|SOFTMAX|SOFTCAP|WINDOW|DROP|REL|SHAW|HUANG|ROPE|ALIBI|T5|SWIN|GRAD|PREC|KERN|BLOCK|VER|PROF)-(\d+)\b"
)


def test_version_is_semver():
    assert SPEC_VERSION == "1.7.0"
    assert re.fullmatch(r"\d+\.\d+\.\d+", SPEC_VERSION)


def test_the_package_and_the_citation_carry_the_spec_version():
    """What pip installs and what people cite name the specification they implement (VER-1)."""
    project = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    citation = re.search(r"^version: (\S+)", (ROOT / "CITATION.cff").read_text(), re.M)
    assert (project.group(1), citation.group(1)) == (SPEC_VERSION, SPEC_VERSION)


def test_specs_are_frozen_and_hashable_by_value():
    a = AttentionSpec(2, 3, relative=Shaw(2))
    b = AttentionSpec(2, 3, relative=Shaw(2))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.num_heads = 4
    assert AttentionSpec(2, 3, scale=1) == AttentionSpec(2, 3, scale=1.0)


def test_model_dim_scale_and_param_shapes():
    s = AttentionSpec(num_heads=2, head_dim=6, relative=Shaw(max_distance=2))
    assert s.model_dim == 12
    assert s.effective_scale == 1 / math.sqrt(6) and s.relative_scale == s.effective_scale
    assert s.param_shapes() == {
        "wq": (12, 12),
        "wk": (12, 12),
        "wv": (12, 12),
        "wo": (12, 12),
        "bq": (12,),
        "bk": (12,),
        "bv": (12,),
        "bo": (12,),
        "rel_k": (5, 6),
        "rel_v": (5, 6),
    }
    h = AttentionSpec(num_heads=3, head_dim=4, bias=False, relative=Huang(max_len=5), scale_relative=False)
    assert h.param_shapes() == {"wq": (12, 12), "wk": (12, 12), "wv": (12, 12), "wo": (12, 12), "rel_k": (3, 9, 4)}
    assert h.relative_scale == 1.0
    assert "rel_k" not in AttentionSpec(1, 2, relative=Shaw(1, keys=False)).param_shapes()


def test_profiles_state_each_program():
    assert profiles.tutorial_mha(4, 2) == AttentionSpec(2, 2)
    e = profiles.einsum_selfattention(embed_size=12, heads=3)
    assert (e.num_heads, e.head_dim) == (3, 4)
    assert e.scale == 1 / math.sqrt(12) and e.mask_fill == -1e20 / math.sqrt(12)
    s = profiles.shaw_rpe(hid_dim=12, n_heads=2)
    assert s.relative == Shaw(2, keys=True, values=True, per_head=False)
    assert s.scale is None and s.scale_relative and s.mask_fill == -1e10
    m = profiles.music_relative(d_model=12, nhead=3, seq_len=8)
    assert m.relative == Huang(8, per_head=False) and not m.scale_relative and m.param_shapes()["rel_k"] == (15, 4)


def test_rule_ids_are_unique_and_well_formed():
    ids = spec.rule_ids()
    assert len(ids) == len(set(ids))
    assert all(RULE_REF.fullmatch(i) for i in ids)
    for required in ("AXES-1", "HEAD-1", "SCALE-3", "MASK-5", "SHAW-4", "HUANG-3", "PREC-1", "VER-1", "PROF-5"):
        assert required in ids


def test_every_rule_cited_in_code_and_docs_exists():
    declared = set(spec.rule_ids())
    sources = [p for d in ("spec", "numpy_ref", "tests") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md")]
    sources.append(ROOT / "README.md")
    dangling = {}
    for path in sources:
        for m in RULE_REF.finditer(path.read_text(encoding="utf-8")):
            if m.group(0) not in declared:
                dangling.setdefault(m.group(0), path.name)
    assert not dangling, f"rule ids cited but not declared in spec/*.md: {dangling}"


def test_every_reference_function_cites_its_rules():
    import inspect

    import numpy_ref
    from numpy_ref import backward, forward, heads, masking, relative

    public = [numpy_ref.attention, numpy_ref.attention_vjp, numpy_ref.init_params]
    modules = [forward, backward, heads, masking, relative]
    helpers = [
        f
        for m in modules
        for n, f in vars(m).items()
        if inspect.isfunction(f) and f.__module__ == m.__name__ and not n.startswith("_")
    ]
    missing = [
        f.__qualname__
        for f in public + helpers
        if not RULE_REF.search((inspect.getdoc(f) or "") + (inspect.getdoc(inspect.getmodule(f)) or ""))
    ]
    assert not missing


def test_scheme_registry_errors_name_what_was_expected():
    import dataclasses

    import pytest

    import spec

    with pytest.raises(TypeError, match=r"register: expected a dataclass subclassing spec.Scheme, got <class 'int'>"):
        spec.register(int)

    @dataclasses.dataclass(frozen=True)
    class Clash(spec.Scheme):
        name = "shaw"
        rule_prefix = "CLASH"

    with pytest.raises(ValueError, match=r"register: scheme name 'shaw' is taken by Shaw"):
        spec.register(Clash)
    with pytest.raises(
        ValueError,
        match=r"unregister: expected a registered scheme name \(alibi, huang, rope, shaw, swin, t5\), got 'nope'",
    ):
        spec.unregister("nope")
    registered = r"\['alibi', 'huang', 'rope', 'shaw', 'swin', 't5'\]"
    with pytest.raises(ValueError, match=rf"scheme: expected one of {registered}, got 'nope'"):
        spec.scheme_from_json({"scheme": "nope"})
    assert spec.scheme_from_json(spec.Shaw(3, per_head=True).to_json()) == spec.Shaw(3, per_head=True)


def test_peer_options_shapes_and_properties():
    """HEAD-3, HEAD-4: wk, wv, wo and rel_v follow Hkv and dv; the defaults keep every weight (D, D)."""
    s = AttentionSpec(4, 3, num_kv_heads=2, value_head_dim=5, relative=Shaw(1, per_head=True))
    assert (s.kv_heads, s.group_size, s.v_head_dim, s.model_dim) == (2, 2, 5, 12)
    assert s.param_shapes() == {
        "wq": (12, 12),
        "wk": (12, 6),
        "wv": (12, 10),
        "wo": (20, 12),
        "bq": (12,),
        "bk": (6,),
        "bv": (10,),
        "bo": (12,),
        "rel_k": (4, 3, 3),
        "rel_v": (4, 3, 5),
    }
    assert s.effective_scale == 1 / 3**0.5  # SCALE-1: d, not dv
    plain = AttentionSpec(4, 3)
    assert (plain.kv_heads, plain.group_size, plain.v_head_dim) == (4, 1, 3)
    assert set(plain.param_shapes().values()) == {(12, 12), (12,)}


def test_window_is_stored_as_a_tuple_and_hashable():
    """WINDOW-1: a list is accepted as the pair; the spec stays hashable (a jit static argument)."""
    s = AttentionSpec(2, 2, window=[3, None], softcap=30)
    assert s.window == (3, None) and s.softcap == 30.0 and isinstance(s.softcap, float)
    assert hash(s) == hash(AttentionSpec(2, 2, window=(3, None), softcap=30.0))
