"""The case catalog: every conformance case, with the rule ids it exercises.

Ids read like what they check: ``<area>/<configuration>/<what>``. They are
stable: a case is never renamed or redrawn within a major version (VER-1);
new cases get new ids.
"""

from __future__ import annotations

import math
from dataclasses import replace

from spec import Alibi, AttentionSpec, Huang, Rope, Shaw, Swin, T5Bias, dynamic_ntk_alpha, profiles

from .cases import Bias, Case, Dims, Keep, Mask, Positions, Twin

CORE = (
    "SHAPE-1",
    "PARAM-1",
    "PROJ-1",
    "HEAD-1",
    "HEAD-2",
    "SCALE-1",
    "SCALE-2",
    "SOFTMAX-1",
    "SOFTMAX-2",
    "OUT-1",
    "GRAD-1",
)
REL = ("REL-1", "REL-2", "REL-3", "REL-4", "SCALE-3")
SHAW = ("SHAW-1", "SHAW-2", "SHAW-3", "SHAW-4")
HUANG = ("HUANG-1", "HUANG-2", "HUANG-4")
ROPE = ("REL-3", "ROPE-1", "ROPE-3", "ROPE-4", "ROPE-5", "ROPE-6", "ROPE-9")
ALIBI = ("REL-3", "SCALE-4", "ALIBI-1", "ALIBI-2")
T5 = ("REL-3", "SCALE-4", "T5-1", "T5-2", "T5-3", "T5-5")
SWIN = ("REL-3", "SCALE-4", "SWIN-1", "SWIN-2", "SWIN-3")

V = AttentionSpec(num_heads=2, head_dim=4)
S2 = AttentionSpec(num_heads=2, head_dim=4, relative=Shaw(2))
H8 = AttentionSpec(num_heads=2, head_dim=4, relative=Huang(8))

D6 = Dims(2, 6, 6)
CROSS = Dims(2, 5, 7)
#: A bias offset that makes every logit about +-1000: exp overflows (or underflows every key) unless the
#: row maximum is subtracted (SOFTMAX-1). The cases are float64 and float32: float16 and bfloat16 cannot
#: hold such a bias to better than a few units (bfloat16's ulp at 1000 is 8: the weights would be noise in any
#: order). In float64 a logit of 1000 is rounded at 1e-13, so the association of its terms (bias, content,
#: relative term), which no rule fixes, moves the result by eps * |logit|: PREC-6's logit term of the floor.
LARGE = 1000.0
WIDE = ("float64", "float32")
WIDE_WHY = "float64 and float32 only: a 16-bit logit near 1000 is rounded by units (bfloat16's ulp there is 8)"
#: A mask_fill near the logits' own size (MASK-6): a filled key keeps a visible weight.
MODERATE_FILL = -1.5
#: (b, h, i): query row i empty in batch element b and head h only (the others attend).
RAGGED_ROWS = ((0, 0, 1), (0, 1, 3), (1, 1, 0))
#: (b, h, j): key j masked for every query of (b, h) only. Key 6 of batch element 0 is masked in
#: both heads (dead there, MASK-7) and alive in batch element 1; keys 2 and 4 are masked in one head.
RAGGED_KEYS = ((0, 0, 2), (1, 1, 4), (0, 0, 6), (0, 1, 6))


def _cases() -> list[Case]:
    c = []
    add = c.append

    # ----------------------------------------------------------- vanilla core
    add(Case("vanilla/self/basic", CORE + ("SHAPE-2", "PARAM-3"), V, D6, self_attention=True))
    add(Case("vanilla/cross/lq5-lk7", CORE, V, CROSS))
    add(Case("vanilla/cross/no-projection-bias", CORE, replace(V, bias=False), CROSS))
    add(Case("vanilla/self/custom-scale", CORE, replace(V, scale=0.7), D6, self_attention=True))
    add(Case("vanilla/self/L1", CORE + ("SHAPE-2",), V, Dims(2, 1, 1), self_attention=True))
    add(Case("vanilla/self/L37-prime-heads3-d5", CORE, AttentionSpec(3, 5), Dims(1, 37, 37), self_attention=True))
    add(Case("vanilla/cross/lq1-lk9", CORE, V, Dims(2, 1, 9)))
    # SHAPE-2's second half: with key given and value omitted, value = key (not the query); in
    # self-attention the two readings coincide, so only a cross case can tell them apart
    add(Case("vanilla/cross/value-omitted", CORE + ("SHAPE-2",), V, D6, value_omitted=True))

    # logits near +1000 and -1000 (SOFTMAX-1: exp overflows or underflows without the row maximum, also
    # in rows with masked keys)
    add(
        Case(
            "vanilla/cross/large-logits",
            ("SOFTMAX-1", "BIAS-1", "PREC-3"),
            V,
            CROSS,
            recipes=(Bias("BHQK", offset=LARGE), Mask("B1QK")),
            dtypes=WIDE,
            notes=WIDE_WHY,
        )
    )
    add(
        Case(
            "vanilla/cross/very-negative-logits",
            ("SOFTMAX-1", "BIAS-1", "PREC-3"),
            V,
            CROSS,
            recipes=(Bias("BHQK", offset=-LARGE),),
            dtypes=WIDE,
            notes=WIDE_WHY,
        )
    )

    # ------------------------------------------------------------ causal
    C = replace(V, causal=True)
    add(
        Case(
            "causal/self/top-left",
            CORE + ("CAUSAL-1", "POS-3", "GRAD-2"),
            C,
            D6,
            self_attention=True,
            twins=(Twin("as-explicit-mask", ("CAUSAL-1",), replace(C, causal=False), "causal-as-mask"),),
        )
    )
    add(Case("causal/cross/lq3-lk7-top-left", ("CAUSAL-1", "POS-3", "GRAD-2"), C, Dims(2, 3, 7)))
    add(Case("causal/cross/lq7-lk3-top-left", ("CAUSAL-1", "POS-3"), C, Dims(2, 7, 3)))
    add(
        Case(
            "causal/cross/lq7-lk3-bottom-right-empty-rows",
            ("CAUSAL-1", "POS-3", "MASK-5", "GRAD-2"),
            C,
            Dims(2, 7, 3),
            recipes=(Positions("bottom-right"),),
        )
    )
    add(
        Case(
            "causal/cross/lq3-lk7-bottom-right",
            ("CAUSAL-1", "POS-1", "POS-3"),
            C,
            Dims(2, 3, 7),
            recipes=(Positions("bottom-right"),),
        )
    )

    # positions that differ per batch element, unsorted, with explicit keys: causality follows them
    add(
        Case(
            "causal/cross/random-positions-per-batch",
            ("CAUSAL-1", "POS-1", "POS-3", "GRAD-2"),
            C,
            CROSS,
            recipes=(Positions("random-per-batch"),),
        )
    )
    add(
        Case(
            "causal/cross/random-queries",
            ("CAUSAL-1", "POS-1", "POS-3"),
            C,
            CROSS,
            recipes=(Positions("random-queries"),),
        )
    )
    add(
        Case(
            "causal/self/long-L640",
            ("CAUSAL-1", "POS-3", "SOFTMAX-1"),
            AttentionSpec(num_heads=1, head_dim=4, causal=True),
            Dims(1, 640, 640),
            self_attention=True,
            store_weights=False,
            notes="three query tiles of every tiled kernel; weights not stored",
        )
    )

    # ------------------------------------------------------------- masks
    for pattern, rank_rules in (("K", ()), ("QK", ()), ("HQK", ()), ("B1QK", ()), ("BHQK", ())):
        add(
            Case(
                f"mask/rank{len(pattern)}-{pattern}",
                ("MASK-1", "MASK-4", "GRAD-2", "GRAD-3") + rank_rules,
                V,
                CROSS,
                recipes=(Mask(pattern),),
                twins=(
                    Twin("full-rank-mask", ("MASK-1",), None, "mask-full-rank"),
                    Twin("as-minus-inf-bias", ("BIAS-2", "MASK-4"), None, "mask-as-bias"),
                ),
            )
        )
    add(
        Case(
            "mask/padding-B11K-dead-keys",
            ("MASK-1", "MASK-4", "MASK-7", "GRAD-2"),
            V,
            CROSS,
            recipes=(Mask("B11K", density=1.0, dead_keys=2),),
        )
    )
    add(Case("mask/fully-masked-rows", ("MASK-4", "MASK-5", "GRAD-2"), V, CROSS, recipes=(Mask("B1QK", empty_rows=2),)))
    add(Case("mask/and-causal", ("MASK-2", "CAUSAL-1", "MASK-4"), C, D6, self_attention=True, recipes=(Mask("B1QK"),)))

    # rows empty in some heads only, keys masked in one head only, a key dead in one batch element only
    add(
        Case(
            "mask/ragged-heads-and-batch",
            ("MASK-1", "MASK-4", "MASK-5", "MASK-7", "GRAD-2"),
            V,
            CROSS,
            recipes=(Mask("BHQK", density=0.85, empty_cells=RAGGED_ROWS, dead_cells=RAGGED_KEYS),),
        )
    )

    # -------------------------------------------------------------- bias
    add(Case("bias/full-BHQK", ("BIAS-1", "SCALE-4", "GRAD-1"), V, CROSS, recipes=(Bias("BHQK"),)))
    add(Case("bias/broadcast-QK", ("BIAS-1", "SCALE-4"), V, CROSS, recipes=(Bias("QK"),)))
    add(Case("bias/minus-inf-entries", ("BIAS-2", "MASK-4", "GRAD-2"), V, CROSS, recipes=(Bias("B1QK", neg_inf=0.25),)))
    add(Case("bias/minus-inf-rows", ("BIAS-2", "MASK-5", "GRAD-2"), V, CROSS, recipes=(Bias("1HQK", empty_rows=1),)))
    add(
        Case(
            "bias/with-mask-and-causal",
            ("BIAS-1", "MASK-2", "MASK-4"),
            C,
            D6,
            self_attention=True,
            recipes=(Bias("QK"), Mask("B11K", density=0.8)),
        )
    )

    # keys removed by the bias alone, a different key in each batch element; a singleton query axis
    add(
        Case(
            "bias/minus-inf-dead-keys-B11K",
            ("BIAS-1", "BIAS-2", "MASK-4", "MASK-7", "GRAD-1", "GRAD-2"),
            V,
            CROSS,
            recipes=(Bias("B11K", dead_keys=((0, 1), (1, 5))),),
        )
    )

    # --------------------------------------------------------- mask_fill
    F = replace(V, mask_fill=-1e9)
    add(Case("mask-fill/-1e9/fully-masked-rows", ("MASK-6", "GRAD-2"), F, CROSS, recipes=(Mask("B1QK", empty_rows=1),)))
    add(
        Case(
            "mask-fill/-1e9/causal", ("MASK-6", "CAUSAL-1", "GRAD-2"), replace(F, causal=True), D6, self_attention=True
        )
    )

    # a fill near the logits (MASK-6): where the fill goes and what it replaces shows in the result;
    # a bias constant along the keys (singleton key axis) is visible only through the filled keys
    add(
        Case(
            "mask-fill/moderate/causal-bias-mask",
            ("MASK-6", "MASK-2", "CAUSAL-1", "BIAS-1", "SCALE-4", "PROJ-1", "GRAD-1", "GRAD-2"),
            replace(V, mask_fill=MODERATE_FILL, causal=True),
            CROSS,
            recipes=(Bias("BHQ1"), Mask("B1QK", empty_rows=1)),
        )
    )

    # ------------------------------------------------------------ dropout
    P = replace(V, dropout=0.3)
    add(Case("dropout/keep-mask", ("DROP-1", "DROP-4", "SOFTMAX-2", "GRAD-3"), P, CROSS, recipes=(Keep(),)))
    add(Case("dropout/no-keep-is-inference", ("DROP-3",), P, CROSS))

    # ---------------------------------------------------------- positions
    add(Case("positions/shifted", ("POS-1", "POS-4"), S2, CROSS, recipes=(Positions("shifted"),)))
    add(Case("positions/per-batch", ("POS-1", "POS-2"), H8, CROSS, recipes=(Positions("per-batch"),)))

    # --------------------------------------------------------------- Shaw
    add(
        Case(
            "shaw/k2/self/basic",
            CORE + REL + SHAW + ("SHAPE-2", "PARAM-3"),
            S2,
            D6,
            self_attention=True,
            twins=(Twin("shifted-positions", ("POS-4",), None, "shift-positions"),),
        )
    )
    add(
        Case("shaw/k2/self/per-head", REL + SHAW, replace(S2, relative=Shaw(2, per_head=True)), D6, self_attention=True)
    )
    add(Case("shaw/k0/self", REL + SHAW, replace(S2, relative=Shaw(0)), D6, self_attention=True))
    add(Case("shaw/k16/cross/beyond-length", REL + SHAW, replace(S2, relative=Shaw(16)), CROSS))
    add(Case("shaw/k2/self/L37-clipped", REL + SHAW + ("SHAW-5",), S2, Dims(1, 37, 37), self_attention=True))
    add(
        Case(
            "shaw/k2/cross/keys-only",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3"),
            replace(S2, relative=Shaw(2, values=False)),
            CROSS,
        )
    )
    # Shaw keys with k past every distance of the call (no clip: BERT's relative_key cannot clip, SHAW-2)
    add(
        Case(
            "shaw/k8/self/keys-within-reach-padding",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3", "MASK-1"),
            replace(S2, relative=Shaw(8, values=False)),
            Dims(2, 9, 9),
            self_attention=True,
            recipes=(Mask("B11K", dead_keys=1),),
        )
    )
    # Shaw keys past the table's reach, clipped (Wav2Vec2-BERT's relative_key clips); and BERT's term added after
    # the scale (ALBERT's relative_key: SCALE-3 with s_rel = 1), within reach (ALBERT cannot clip)
    add(
        Case(
            "shaw/k3/self/keys-only-clipped-padding",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3", "MASK-1"),
            replace(S2, relative=Shaw(3, values=False)),
            Dims(2, 9, 9),
            self_attention=True,
            recipes=(Mask("B11K", dead_keys=1),),
        )
    )
    add(
        Case(
            "shaw/k8/self/keys-unscaled-within-reach-padding",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3", "MASK-1"),
            replace(S2, relative=Shaw(8, values=False), scale_relative=False),
            Dims(2, 9, 9),
            self_attention=True,
            recipes=(Mask("B11K", dead_keys=1),),
        )
    )
    add(
        Case(
            "shaw/k8/cross/keys-within-reach-empty-row",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3", "MASK-4", "MASK-5"),
            replace(S2, relative=Shaw(8, values=False)),
            CROSS,
            recipes=(Mask("B1QK", empty_rows=1),),
        )
    )
    add(
        Case(
            "shaw/k2/cross/values-only-per-head",
            ("REL-1", "REL-2", "SHAW-1", "SHAW-2", "SHAW-4"),
            replace(S2, relative=Shaw(2, keys=False, per_head=True)),
            CROSS,
        )
    )
    add(Case("shaw/k2/self/unscaled-relative", REL + SHAW, replace(S2, scale_relative=False), D6, self_attention=True))
    add(
        Case(
            "shaw/k3/cross/causal-bottom-right",
            REL + SHAW + ("CAUSAL-1", "POS-3"),
            replace(S2, relative=Shaw(3), causal=True),
            Dims(2, 3, 7),
            recipes=(Positions("bottom-right"),),
        )
    )
    add(
        Case(
            "shaw/k2/cross/padding-dead-keys",
            SHAW + ("MASK-7",),
            S2,
            CROSS,
            recipes=(Mask("B11K", density=1.0, dead_keys=2),),
        )
    )
    add(
        Case(
            "shaw/k2/cross/fully-masked-rows",
            SHAW + ("MASK-5", "GRAD-2"),
            S2,
            CROSS,
            recipes=(Mask("BHQK", empty_rows=1),),
        )
    )
    add(Case("shaw/k2/cross/random-positions", SHAW + ("POS-1", "POS-2"), S2, CROSS, recipes=(Positions("random"),)))
    add(
        Case(
            "shaw/k2/cross/dropout-both-value-terms",
            SHAW + ("DROP-1", "DROP-4"),
            replace(S2, dropout=0.25),
            CROSS,
            recipes=(Keep(),),
        )
    )

    add(
        Case(
            "shaw/k2/cross/per-batch-offsets-causal",
            REL + SHAW + ("POS-1", "POS-2", "POS-3", "CAUSAL-1", "MASK-5", "MASK-7"),
            replace(S2, causal=True),
            CROSS,
            recipes=(Positions("per-batch-offsets"),),
        )
    )
    add(
        Case(
            "shaw/k2/cross/custom-scale-random-queries",
            REL + SHAW + ("SCALE-1", "POS-1"),
            replace(S2, scale=0.7),
            CROSS,
            recipes=(Positions("random-queries"),),
        )
    )
    add(
        Case(
            "shaw/k2/cross/mask-fill-moderate",
            REL + SHAW + ("MASK-6", "BIAS-1", "SCALE-4"),
            replace(S2, mask_fill=MODERATE_FILL, causal=True),
            CROSS,
            recipes=(Bias("1HQK"), Mask("B1QK", empty_rows=1)),
        )
    )
    # a fill far below the logits on a row with no allowed key (MASK-6): its weights are uniform over every key,
    # and so its value term (SHAW-4); a kernel that takes the value term's weights from a log-sum-exp rounded at
    # the fill's magnitude (1e9: a unit in the last place is 64 in float32, 1.2e-7 in float64) gets them wrong
    add(
        Case(
            "shaw/k2/cross/mask-fill-1e9-fully-masked-row",
            REL + SHAW + ("MASK-6", "GRAD-2"),
            replace(S2, mask_fill=-1e9),
            CROSS,
            recipes=(Mask("B1QK", empty_rows=1),),
        )
    )
    add(
        Case(
            "shaw/k2/cross/ragged-heads-per-head",
            SHAW + ("MASK-4", "MASK-5", "MASK-7", "BIAS-2", "GRAD-2"),
            replace(S2, relative=Shaw(2, per_head=True)),
            CROSS,
            recipes=(
                Mask("BHQK", density=0.85, empty_cells=RAGGED_ROWS, dead_cells=RAGGED_KEYS),
                Bias("B11K", dead_keys=((1, 0),)),
            ),
        )
    )
    add(
        Case(
            "shaw/k3/self/causal-long-L640",
            SHAW + ("CAUSAL-1", "SHAW-5"),
            AttentionSpec(num_heads=1, head_dim=4, relative=Shaw(3), causal=True),
            Dims(1, 640, 640),
            self_attention=True,
            store_weights=False,
            notes="three query tiles of every tiled kernel; weights not stored",
        )
    )

    add(
        Case(
            "shaw/k2/cross/large-logits",
            REL + SHAW + ("SOFTMAX-1", "PREC-3"),
            S2,
            CROSS,
            recipes=(Bias("1HQK", offset=LARGE),),
            dtypes=WIDE,
            notes=WIDE_WHY,
        )
    )

    add(
        Case(
            "shaw/k2/cross/causal-unsigned-positions",
            SHAW + ("POS-1", "POS-2", "CAUSAL-1"),
            replace(S2, causal=True),
            CROSS,
            recipes=(Positions("unsigned"),),
        )
    )

    # -------------------------------------------------------------- Huang
    add(Case("huang/M8/self/per-head", CORE + REL + HUANG + ("SHAPE-2",), H8, D6, self_attention=True))
    add(
        Case(
            "huang/M8/self/shared-table",
            REL + HUANG,
            replace(H8, relative=Huang(8, per_head=False)),
            D6,
            self_attention=True,
        )
    )
    add(
        Case(
            "huang/M6/self/shared-fits-equals-shaw",
            REL + HUANG + ("HUANG-5",),
            replace(H8, relative=Huang(6, per_head=False)),
            D6,
            self_attention=True,
            twins=(Twin("as-shaw-keys-only", ("HUANG-5",), replace(H8, relative=Shaw(5, values=False)), "same"),),
        )
    )
    add(Case("huang/M3/cross/beyond-table", REL + HUANG + ("HUANG-3",), replace(H8, relative=Huang(3)), CROSS))
    add(
        Case(
            "huang/M4/cross/spread-positions-beyond-table",
            HUANG + ("HUANG-3", "POS-1"),
            replace(H8, relative=Huang(4)),
            CROSS,
            recipes=(Positions("spread"),),
        )
    )
    add(Case("huang/M8/self/causal", REL + HUANG + ("CAUSAL-1",), replace(H8, causal=True), D6, self_attention=True))
    add(
        Case(
            "huang/M7/cross/causal-bottom-right",
            HUANG + ("CAUSAL-1", "POS-3"),
            replace(H8, relative=Huang(7), causal=True),
            Dims(2, 3, 7),
            recipes=(Positions("bottom-right"),),
        )
    )
    add(
        Case(
            "huang/M5/cross/random-positions-gather",
            HUANG + ("POS-1", "POS-2"),
            replace(H8, relative=Huang(5)),
            CROSS,
            recipes=(Positions("random"),),
        )
    )
    add(
        Case("huang/M8/self/unscaled-relative", REL + HUANG, replace(H8, scale_relative=False), D6, self_attention=True)
    )
    add(
        Case(
            "huang/M8/cross/bias-and-mask",
            HUANG + ("BIAS-1", "MASK-1"),
            H8,
            CROSS,
            recipes=(Bias("1HQK", neg_inf=0.1), Mask("B1QK")),
        )
    )
    add(
        Case(
            "huang/M512/self/causal-long-L512",
            HUANG + ("CAUSAL-1", "HUANG-3"),
            AttentionSpec(num_heads=1, head_dim=4, relative=Huang(512), causal=True),
            Dims(1, 512, 512),
            self_attention=True,
            store_weights=False,
            notes="long sequence, one head of 4 channels: small in bytes; weights not stored",
        )
    )

    add(
        Case(
            "huang/M3/self/causal-beyond-table",
            REL + HUANG + ("HUANG-3", "CAUSAL-1"),
            replace(H8, relative=Huang(3), causal=True),
            D6,
            self_attention=True,
        )
    )
    add(
        Case(
            "huang/M3/cross/causal-random-queries",
            HUANG + ("HUANG-3", "POS-1", "POS-3", "CAUSAL-1", "MASK-5", "MASK-7"),
            replace(H8, relative=Huang(3), causal=True),
            CROSS,
            recipes=(Positions("random-queries"),),
        )
    )
    add(
        Case(
            "huang/M5/cross/custom-scale-per-batch-offsets-causal",
            REL + HUANG + ("HUANG-3", "SCALE-1", "POS-1", "POS-2", "POS-3", "CAUSAL-1"),
            replace(H8, relative=Huang(5), scale=0.7, causal=True),
            CROSS,
            recipes=(Positions("per-batch-offsets"),),
        )
    )
    add(
        Case(
            "huang/M4/cross/mask-fill-moderate",
            REL + HUANG + ("HUANG-3", "MASK-6", "CAUSAL-1"),
            replace(H8, relative=Huang(4), mask_fill=MODERATE_FILL, causal=True),
            CROSS,
            recipes=(Mask("B1QK", empty_rows=1),),
        )
    )
    add(
        Case(
            "huang/M4/cross/ragged-heads-shared",
            HUANG + ("MASK-4", "MASK-5", "MASK-7", "BIAS-2", "GRAD-2"),
            replace(H8, relative=Huang(4, per_head=False)),
            CROSS,
            recipes=(
                Mask("BHQK", density=0.85, empty_cells=RAGGED_ROWS, dead_cells=RAGGED_KEYS),
                Bias("BH1K", dead_keys=((1, 0),)),
            ),
        )
    )

    add(
        Case(
            "huang/M5/cross/very-negative-logits",
            REL + HUANG + ("SOFTMAX-1", "PREC-3"),
            replace(H8, relative=Huang(5)),
            CROSS,
            recipes=(Bias("1HQK", offset=-LARGE),),
            dtypes=WIDE,
            notes=WIDE_WHY,
        )
    )

    # the skew of consecutive positions against the gather of any others (HUANG-4 lets an
    # implementation choose; the choice must follow the positions): position patterns that are
    # nearly consecutive, B != H, one-row tables
    add(
        Case(
            "huang/M3/cross/strided-positions-B3",
            HUANG + ("HUANG-3", "POS-1", "POS-2"),
            replace(H8, relative=Huang(3)),
            Dims(3, 4, 5),
            recipes=(Positions("strided-per-batch"),),
        )
    )
    add(
        Case(
            "huang/M1/cross/gapped-queries",
            HUANG + ("HUANG-3", "POS-1"),
            replace(H8, relative=Huang(1)),
            CROSS,
            recipes=(Positions("gapped-queries"),),
        )
    )
    add(
        Case(
            "huang/M8/cross/constant-positions-L2",
            HUANG + ("POS-1", "POS-2"),
            H8,
            Dims(2, 2, 2),
            recipes=(Positions("constant"),),
        )
    )
    add(
        Case(
            "huang/M1/self/causal-one-row-table",
            REL + HUANG + ("HUANG-3", "CAUSAL-1"),
            replace(H8, relative=Huang(1), causal=True),
            D6,
            self_attention=True,
        )
    )

    # ------------------------------------------- Shaw's key-side term (SHAW-6, SHAW-7)
    # BERT's relative_key_query: the key-side term reads rel_k, with every distance of the call in the
    # table (BERT cannot clip), scaled with the rest (SHAW-7); ESM leaves it unscaled
    KS = replace(S2, relative=Shaw(8, values=False, key_side="shared"))
    add(
        Case(
            "shaw-key-side/k2/self/shared",
            CORE + REL + SHAW + ("SHAW-6", "SHAW-7"),
            replace(S2, relative=Shaw(2, values=False, key_side="shared")),
            D6,
            self_attention=True,
        )
    )
    add(
        Case(
            "shaw-key-side/k8/self/shared-within-reach-padding",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3", "SHAW-6", "SHAW-7", "MASK-1", "MASK-7"),
            KS,
            Dims(2, 9, 9),
            self_attention=True,
            recipes=(Mask("B11K", dead_keys=1),),
        )
    )
    # ALBERT's relative_key_query: both relative terms from the one table, added after the scale (s_rel = 1)
    add(
        Case(
            "shaw-key-side/k8/self/shared-unscaled-relative-padding",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3", "SHAW-6", "SHAW-7", "MASK-1"),
            replace(KS, scale_relative=False),
            Dims(2, 9, 9),
            self_attention=True,
            recipes=(Mask("B11K", dead_keys=1),),
        )
    )
    # DeBERTa-v2's self-attention as it runs: content-to-position and position-to-content from tables of their
    # own per head, past their reach (clipped), one scale 1 / sqrt(3 d) for the three logits, a padding mask
    add(
        Case(
            "shaw-key-side/k2/self/own-per-head-scale-third-padding",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3", "SHAW-6", "SHAW-7", "SCALE-1", "MASK-1"),
            replace(S2, relative=Shaw(2, values=False, per_head=True, key_side="own"), scale=1 / math.sqrt(3 * 4)),
            Dims(2, 9, 9),
            self_attention=True,
            recipes=(Mask("B11K", dead_keys=1),),
        )
    )
    add(
        Case(
            "shaw-key-side/k8/self/shared-unscaled",
            REL + ("SHAW-1", "SHAW-2", "SHAW-3", "SHAW-6", "SHAW-7"),
            replace(S2, relative=Shaw(8, values=False, key_side="shared", key_side_scaled=False)),
            Dims(2, 9, 9),
            self_attention=True,
        )
    )
    # DeBERTa's two relative terms: content-to-position (the key term) and position-to-content (the
    # key-side term, its own per-head table), all three logits under one scale 1 / sqrt(3 d)
    add(
        Case(
            "shaw-key-side/k2/cross/own-table-per-head-scale",
            REL + SHAW + ("SHAW-6", "SHAW-7", "SCALE-1", "POS-1", "POS-2"),
            replace(
                S2,
                scale=1.0 / math.sqrt(3 * S2.head_dim),
                relative=Shaw(2, values=False, per_head=True, key_side="own"),
            ),
            CROSS,
            recipes=(Positions("random"),),
        )
    )
    add(
        Case(
            "shaw-key-side/k2/cross/own-only-causal-bottom-right",
            ("REL-1", "REL-3", "SHAW-1", "SHAW-2", "SHAW-6", "SHAW-7", "CAUSAL-1", "POS-3"),
            replace(S2, relative=Shaw(2, keys=False, values=False, key_side="own"), causal=True),
            Dims(2, 3, 7),
            recipes=(Positions("bottom-right"),),
        )
    )
    # every Shaw term, unscaled (ALBERT adds its relative terms after the scale: s_rel = 1 for both)
    add(
        Case(
            "shaw-key-side/k2/self/all-terms-unscaled-relative",
            REL + SHAW + ("SHAW-6", "SHAW-7"),
            replace(S2, relative=Shaw(2, key_side="own"), scale_relative=False),
            D6,
            self_attention=True,
        )
    )
    add(
        Case(
            "shaw-key-side/gqa/cross/shared-per-head-dropout-mask",
            REL + SHAW + ("SHAW-6", "HEAD-3", "DROP-1", "DROP-4", "MASK-2"),
            AttentionSpec(
                num_heads=4,
                head_dim=2,
                num_kv_heads=2,
                relative=Shaw(2, per_head=True, key_side="shared"),
                dropout=0.25,
            ),
            CROSS,
            recipes=(Mask("B1QK"), Keep()),
        )
    )
    add(
        Case(
            "shaw-key-side/k2/cross/fully-masked-rows-dead-keys",
            ("SHAW-6", "MASK-5", "MASK-7", "GRAD-2"),
            replace(S2, relative=Shaw(2, values=False, key_side="own")),
            CROSS,
            recipes=(Mask("BHQK", empty_rows=1, dead_keys=1),),
        )
    )
    # (B, L) positions: each batch element's key-side rows follow its own distances (B = H = 2)
    add(
        Case(
            "shaw-key-side/k2/cross/per-batch-positions",
            ("SHAW-6", "POS-1", "POS-2"),
            replace(S2, relative=Shaw(2, values=False, key_side="own")),
            CROSS,
            recipes=(Positions("random-per-batch"),),
        )
    )
    add(
        Case(
            "shaw-key-side/k2/cross/softcap",
            ("SHAW-6", "SHAW-7", "SOFTCAP-1"),
            replace(S2, relative=Shaw(2, values=False, key_side="shared"), softcap=1.0),
            CROSS,
        )
    )

    # ---------------------------------------------- Huang's value term (HUANG-6)
    HV = replace(H8, relative=Huang(8, values=True))
    add(Case("huang-values/M8/self/per-head", CORE + REL + HUANG + ("HUANG-6",), HV, D6, self_attention=True))
    add(
        Case(
            "huang-values/M3/cross/beyond-table",
            REL + HUANG + ("HUANG-3", "HUANG-6"),
            replace(H8, relative=Huang(3, values=True)),
            CROSS,
        )
    )
    # tensor2tensor's causal layer with add_relative_to_values: rows 0 .. M - 1, distances past the table
    add(
        Case(
            "huang-values/M4/self/causal-beyond-table",
            REL + HUANG + ("HUANG-3", "HUANG-6", "CAUSAL-1"),
            replace(H8, relative=Huang(4, values=True), causal=True),
            Dims(2, 9, 9),
            self_attention=True,
        )
    )
    add(
        Case(
            "huang-values/M3/cross/shared-dv5-random-positions",
            REL + HUANG + ("HUANG-6", "HEAD-4", "POS-1", "POS-2"),
            replace(H8, relative=Huang(3, per_head=False, values=True), value_head_dim=5),
            CROSS,
            recipes=(Positions("random"),),
        )
    )
    add(
        Case(
            "huang-values/M3/cross/per-batch-positions",
            ("HUANG-3", "HUANG-6", "POS-1", "POS-2"),
            replace(H8, relative=Huang(3, values=True)),
            CROSS,
            recipes=(Positions("random-per-batch"),),
        )
    )
    add(
        Case(
            "huang-values/M4/cross/dropout",
            ("HUANG-6", "DROP-1", "DROP-4"),
            replace(H8, relative=Huang(4, values=True), dropout=0.25),
            CROSS,
            recipes=(Keep(),),
        )
    )
    add(
        Case(
            "huang-values/M3/cross/fully-masked-rows",
            ("HUANG-6", "MASK-5", "GRAD-2"),
            replace(H8, relative=Huang(3, values=True)),
            CROSS,
            recipes=(Mask("BHQK", empty_rows=1),),
        )
    )

    # ------------------------------------------------ peer options (HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1)
    G = AttentionSpec(num_heads=4, head_dim=2, num_kv_heads=2)
    add(Case("peer/gqa/self/h4-kv2", CORE + ("HEAD-3", "PARAM-3"), G, D6, self_attention=True))
    add(
        Case(
            "peer/mqa/cross/shaw-per-head-masked",
            REL + SHAW + ("HEAD-3", "MASK-1", "MASK-7"),
            replace(G, num_kv_heads=1, relative=Shaw(2, per_head=True)),
            CROSS,
            # key 5 of batch element 0 is masked for all four query heads (dead, MASK-7); key 2 of batch
            # element 1 for query heads 0 and 1 only, the group of the one key/value head in half
            recipes=(Mask("BHQK", dead_cells=((0, 0, 5), (0, 1, 5), (0, 2, 5), (0, 3, 5), (1, 0, 2), (1, 1, 2))),),
        )
    )
    add(Case("peer/value-head-dim/cross/dv6", CORE + ("HEAD-4", "PARAM-3"), replace(V, value_head_dim=6), CROSS))
    add(
        Case(
            "peer/value-head-dim/self/gqa-shaw-values-causal",
            REL + SHAW + ("HEAD-3", "HEAD-4", "CAUSAL-1"),
            replace(G, value_head_dim=3, relative=Shaw(2), causal=True),
            D6,
            self_attention=True,
        )
    )
    # a cap of 1 bends every logit; -inf bias entries must stay disallowed (the cap comes before the bias)
    add(
        Case(
            "peer/softcap/cross/cap1-bias-minus-inf",
            ("SOFTCAP-1", "BIAS-1", "BIAS-2", "MASK-4", "GRAD-1", "GRAD-2"),
            replace(V, softcap=1.0),
            CROSS,
            recipes=(Bias("B1QK", neg_inf=0.25),),
        )
    )
    # scale 2 pushes the scores into the cap's saturation; the Huang key term is capped with them;
    # one key/value head for both query heads (multi-query), each query head with its own Huang table
    add(
        Case(
            "peer/softcap/self/huang-causal-scale2",
            REL + HUANG + ("SOFTCAP-1", "SCALE-1", "SCALE-3", "CAUSAL-1", "HEAD-3"),
            replace(H8, softcap=3.0, scale=2.0, causal=True, num_kv_heads=1),
            D6,
            self_attention=True,
        )
    )
    add(
        Case(
            "peer/window/self/sliding-causal",
            CORE + ("WINDOW-1", "MASK-2", "MASK-4", "CAUSAL-1"),
            replace(V, causal=True, window=(2, None)),
            Dims(2, 9, 9),
            self_attention=True,
            twins=(Twin("as-explicit-mask", ("WINDOW-1", "MASK-2"), replace(V, causal=True), "window-as-mask"),),
        )
    )
    # decoding 3 new tokens against 8 cached keys with a sliding window of 4 (Mistral's layer: GQA too)
    add(
        Case(
            "peer/window/cross/sliding-decoding-gqa",
            ("WINDOW-1", "POS-3", "CAUSAL-1", "HEAD-3"),
            replace(G, causal=True, window=(3, None)),
            Dims(2, 3, 8),
            recipes=(Positions("bottom-right"),),
        )
    )
    add(
        Case(
            "peer/window/cross/two-sided-decoding-shaw",
            REL + SHAW + ("WINDOW-1", "POS-3"),
            replace(S2, window=(1, 2)),
            CROSS,
            recipes=(Positions("bottom-right"),),
        )
    )
    # window (0, 0): a query attends only a key at its own position; the gap leaves rows empty (MASK-5)
    add(
        Case(
            "peer/window/cross/own-position-empty-rows",
            REL + HUANG + ("WINDOW-1", "MASK-5", "MASK-7", "GRAD-2", "HEAD-4"),
            replace(H8, window=(0, 0), value_head_dim=5),
            Dims(2, 6, 7),
            recipes=(Positions("gapped-queries"),),
        )
    )
    # every option at once, with dropout and a mask: the rules compose
    add(
        Case(
            "peer/all/cross/gqa-dv-softcap-window-shaw-dropout",
            REL + SHAW + ("HEAD-3", "HEAD-4", "SOFTCAP-1", "WINDOW-1", "DROP-1", "DROP-4", "MASK-2"),
            AttentionSpec(
                num_heads=4,
                head_dim=2,
                num_kv_heads=2,
                value_head_dim=3,
                softcap=2.0,
                window=(3, 1),
                relative=Shaw(2, per_head=True),
                dropout=0.25,
            ),
            CROSS,
            # (B, L) positions: the window follows each batch element's own distances
            recipes=(Mask("B1QK"), Keep(), Positions("random-per-batch")),
        )
    )

    # ------------------------------------------------------------------ RoPE (ROPE-1..ROPE-16)
    R = AttentionSpec(num_heads=2, head_dim=8, relative=Rope())
    RI = replace(R, relative=Rope(layout="interleaved"))
    add(
        Case(
            "rope/half/self/basic",
            CORE + ROPE + ("PARAM-3", "ROPE-8"),
            R,
            D6,
            self_attention=True,
            # ROPE-8: the same layer in the other layout, with its q/k weights permuted, is the same layer
            twins=(Twin("interleaved-permuted", ("ROPE-8",), RI, params="rope-layout"),),
        )
    )
    add(
        Case(
            "rope/interleaved/cross/lq5-lk7",
            CORE + ROPE,
            RI,
            CROSS,
            twins=(Twin("half-permuted", ("ROPE-8",), R, params="rope-layout"),),
        )
    )
    # ROPE-2: 4 of 8 channels rotate, frequencies over r = 4; a small theta turns every pair visibly
    add(
        Case(
            "rope/half/cross/partial-r4-theta100",
            ROPE + ("ROPE-2",),
            replace(R, relative=Rope(theta=100.0, rotary_dim=4)),
            CROSS,
            twins=(
                Twin(
                    "interleaved-permuted",
                    ("ROPE-8", "ROPE-2"),
                    replace(R, relative=Rope(theta=100.0, rotary_dim=4, layout="interleaved")),
                    params="rope-layout",
                ),
            ),
        )
    )
    add(
        Case(
            "rope/interleaved/self/partial-r6-causal-bias",
            ROPE + ("ROPE-2", "CAUSAL-1", "BIAS-1"),
            replace(R, relative=Rope(rotary_dim=6, layout="interleaved"), causal=True),
            D6,
            self_attention=True,
            recipes=(Bias("B1QK"),),
        )
    )
    # the scaling constructors: explicit frequencies (and YaRN's attention factor, ROPE-7)
    add(
        Case(
            "rope/linear/cross/factor4-shifted",
            ROPE + ("ROPE-12", "POS-4"),
            replace(R, relative=Rope.linear(4.0, rotary_dim=8)),
            CROSS,
            recipes=(Positions("shifted"),),
        )
    )
    add(
        Case(
            "rope/ntk/cross/alpha3-no-projection-bias",
            ROPE + ("ROPE-13", "PROJ-1"),
            replace(R, relative=Rope.ntk(3.0, rotary_dim=8), bias=False),
            CROSS,
        )
    )
    # ROPE-11: dynamic NTK scaling for a call of 9 keys past an original length of 4 is Rope.ntk(alpha(9))
    add(
        Case(
            "rope/ntk/cross/dynamic-at-context-length-9",
            ROPE + ("ROPE-11", "ROPE-13"),
            replace(R, relative=Rope.ntk(dynamic_ntk_alpha(2.0, 4, 9), rotary_dim=8)),
            Dims(2, 4, 9),
        )
    )
    add(
        Case(
            "rope/yarn/cross/factor8-decoding",
            ROPE + ("ROPE-14", "ROPE-7", "ROPE-10", "POS-3", "CAUSAL-1"),
            replace(R, relative=Rope.yarn(8.0, 16, rotary_dim=8), causal=True),
            Dims(2, 3, 8),
            recipes=(Positions("bottom-right"),),
        )
    )
    add(
        Case(
            "rope/llama3/self/factor8-far",
            ROPE + ("ROPE-15",),
            replace(R, relative=Rope.llama3(8.0, 1.0, 4.0, 32, rotary_dim=8)),
            D6,
            self_attention=True,
            recipes=(Positions("far"),),
        )
    )
    # Gemma's proportional rotation: all 8 channels pair over r = 8, only the first pair turns
    add(
        Case(
            "rope/proportional/cross/quarter-masked",
            ROPE + ("ROPE-16", "ROPE-4", "MASK-1", "MASK-5"),
            replace(R, relative=Rope.proportional(0.25, rotary_dim=8)),
            CROSS,
            recipes=(Mask("B1QK", empty_rows=1),),
        )
    )
    # ROPE-9: positions near 2**17, where an angle made in float32 is off by about 1e-2 radians and a
    # position rounded to bfloat16 is off by up to 512
    add(
        Case(
            "rope/half/cross/offset-2p17",
            ROPE + ("POS-1",),
            replace(R, relative=Rope(theta=500.0)),
            CROSS,
            recipes=(Positions("far"),),
        )
    )
    add(
        Case(
            "rope/interleaved/cross/per-batch-positions-gqa",
            ROPE + ("POS-1", "HEAD-3", "ROPE-7"),
            AttentionSpec(
                num_heads=4, head_dim=4, num_kv_heads=2, relative=Rope(layout="interleaved", attention_factor=1.25)
            ),
            CROSS,
            recipes=(Positions("random-per-batch"),),
        )
    )
    add(
        Case(
            "rope/half/cross/decoding-gqa-mask-dropout",
            ROPE + ("POS-3", "CAUSAL-1", "HEAD-3", "MASK-1", "DROP-1", "ROPE-10"),
            AttentionSpec(num_heads=4, head_dim=4, num_kv_heads=1, causal=True, dropout=0.25, relative=Rope()),
            Dims(2, 3, 8),
            recipes=(Positions("bottom-right"), Mask("B11K", dead_keys=1), Keep()),
        )
    )
    # ROPE-10: a prefill of 4 queries, then 5 steps of one query each against a static cache of 9 slots,
    # equal to the full causal forward
    add(
        Case(
            "rope/half/self/prefill-then-steps",
            ROPE + ("ROPE-10", "POS-3", "CAUSAL-1", "MASK-7"),
            replace(R, causal=True, relative=Rope(rotary_dim=6)),
            Dims(2, 9, 9),
            self_attention=True,
            decode_from=4,
        )
    )

    # RoPE through every other path: the rotation happens before them, and must not disturb them
    add(
        Case(
            "rope/half/self/causal-long-L512",
            ROPE + ("CAUSAL-1", "SOFTMAX-1"),
            AttentionSpec(num_heads=1, head_dim=8, causal=True, relative=Rope(theta=1000.0)),
            Dims(1, 512, 512),
            self_attention=True,
            store_weights=False,
            notes="several query tiles of every tiled kernel; weights not stored",
        )
    )
    add(
        Case(
            "rope/interleaved/cross/ragged-heads-minus-inf-bias",
            ROPE + ("MASK-1", "MASK-4", "MASK-5", "MASK-7", "BIAS-1", "BIAS-2", "GRAD-2"),
            RI,
            CROSS,
            # queries at non-consecutive positions against the default keys; rows and keys masked in some
            # heads only; a -inf bias with a singleton query axis removes key 3 of batch element 1 alone
            recipes=(
                Mask("BHQK", density=0.85, empty_cells=RAGGED_ROWS, dead_cells=RAGGED_KEYS),
                Bias("B11K", neg_inf=0.15, dead_keys=((1, 3),)),
                Positions("gapped-queries"),
            ),
        )
    )
    add(
        Case(
            "rope/half/cross/peer-options-causal-positions",
            ROPE + ("ROPE-2", "SCALE-1", "HEAD-4", "SOFTCAP-1", "WINDOW-1", "MASK-6", "CAUSAL-1", "POS-1"),
            AttentionSpec(
                num_heads=2,
                head_dim=8,
                scale=0.5,
                value_head_dim=6,
                softcap=2.0,
                window=(2, 1),
                causal=True,
                mask_fill=MODERATE_FILL,
                relative=Rope(rotary_dim=6),
            ),
            CROSS,
            recipes=(Positions("per-batch-offsets"),),
        )
    )
    add(
        Case(
            "rope/half/cross/large-logits",
            ROPE + ("SOFTMAX-1", "BIAS-1", "PREC-3"),
            R,
            CROSS,
            recipes=(Bias("BHQK", offset=LARGE), Mask("B1QK")),
            dtypes=WIDE,
            notes=WIDE_WHY,
        )
    )

    # ------------------------------------------------------------ ALiBi (ALIBI-1..ALIBI-5)
    def alibi(H: int, d: int = 2, slopes=None, symmetric: bool = True, **kw) -> AttentionSpec:
        return AttentionSpec(num_heads=H, head_dim=d, relative=Alibi(slopes, symmetric=symmetric), **kw)

    add(
        Case(
            "alibi/self/h1-causal",
            CORE + ALIBI + ("ALIBI-3", "CAUSAL-1", "PARAM-3"),
            alibi(1, 4, causal=True),
            D6,
            self_attention=True,
        )
    )
    # a custom scale that the bias must not get (SCALE-4); keys on both sides of every query (ALIBI-3)
    add(Case("alibi/cross/h2-symmetric-scale", ALIBI + ("ALIBI-3", "SCALE-1"), alibi(2, 4, scale=0.5), CROSS))
    # ALIBI-4: the linear form without a causal mask rewards the keys after the query
    add(Case("alibi/cross/h3-linear", ALIBI + ("ALIBI-4",), alibi(3, symmetric=False), CROSS))
    # ALIBI-4: under a causal mask the linear form is the symmetric one
    add(
        Case(
            "alibi/self/h5-linear-causal",
            ALIBI + ("ALIBI-4", "CAUSAL-1"),
            alibi(5, symmetric=False, causal=True),
            Dims(2, 7, 7),
            self_attention=True,
            twins=(Twin("symmetric", ("ALIBI-4", "CAUSAL-1"), alibi(5, causal=True)),),
        )
    )
    add(Case("alibi/self/h12-causal", ALIBI + ("ALIBI-3", "PARAM-3"), alibi(12, causal=True), D6, self_attention=True))
    add(Case("alibi/cross/h40", ALIBI + ("ALIBI-3",), alibi(40, 1, num_kv_heads=1, bias=False), Dims(1, 3, 5)))
    # explicit slopes (one of them 0), grouped key/value heads, a padding mask, decoding positions
    add(
        Case(
            "alibi/cross/explicit-slopes-gqa-masked",
            ALIBI + ("ALIBI-3", "ALIBI-5", "HEAD-3", "MASK-1", "MASK-7", "POS-3"),
            alibi(4, slopes=(0.5, 0.0, 0.25, 1.0), num_kv_heads=2),
            CROSS,
            recipes=(Positions("bottom-right"), Mask("B11K", dead_keys=1)),
        )
    )
    # ALIBI-5: one query against a long cache, bottom-right: the far keys' bias is large
    add(
        Case(
            "alibi/cross/lq1-cache-1024",
            ALIBI + ("ALIBI-3", "ALIBI-5", "POS-3", "CAUSAL-1"),
            alibi(4, 1, causal=True),
            Dims(1, 1, 1024),
            value_omitted=True,
            recipes=(Positions("bottom-right"),),
            store_weights=False,
        )
    )
    # ALIBI-5, PREC-4: the first queries of a 2048-key sequence; a linear-form bias m * (j - (Lk - 1)) made
    # in a 16-bit dtype is rounded by units here, while the spec's bias of these keys is small
    add(
        Case(
            "alibi/cross/early-queries-of-2048",
            ALIBI + ("ALIBI-3", "ALIBI-5", "CAUSAL-1", "PREC-4"),
            alibi(4, 1, causal=True),
            Dims(1, 8, 2048),
            value_omitted=True,
            store_weights=False,
        )
    )

    # ------------------------------------------------------------ T5 (T5-1..T5-5)
    # every distance up to 4 max_distance in both directions (T5-2, T5-3): 8 buckets, max_distance 10
    add(
        Case(
            "t5/self/bidirectional-every-distance-to-4M",
            CORE + T5 + ("PARAM-3",),
            AttentionSpec(num_heads=2, head_dim=2, relative=T5Bias(8, 10)),
            Dims(1, 41, 41),
            self_attention=True,
        )
    )
    # the default 32 buckets up to 4 * 128: queries spread over 513 keys; saturation (T5-3)
    add(
        Case(
            "t5/cross/default-buckets-to-512",
            T5,
            AttentionSpec(num_heads=2, head_dim=2, relative=T5Bias()),
            Dims(1, 5, 513),
            value_omitted=True,
            recipes=(Positions("spread-queries"),),
        )
    )
    # T5-2: a causal bias without a causal mask: every later key is bucket 0, and attended
    add(
        Case(
            "t5/self/unidirectional-future-keys-attended",
            T5,
            AttentionSpec(num_heads=2, head_dim=2, relative=T5Bias(8, 10, bidirectional=False)),
            Dims(2, 9, 9),
            self_attention=True,
        )
    )
    # T5 as T5 runs it: scale 1, no projection biases, a causal decoder
    add(
        Case(
            "t5/self/decoder-scale1-no-bias",
            T5 + ("CAUSAL-1", "SCALE-1"),
            AttentionSpec(num_heads=3, head_dim=2, bias=False, scale=1.0, causal=True, relative=T5Bias(6, 5, False)),
            Dims(2, 7, 7),
            self_attention=True,
        )
    )
    # T5's encoder as T5 runs it: bidirectional self-attention, scale 1, no projection biases, a padding mask
    add(
        Case(
            "t5/self/encoder-scale1-no-bias-padding",
            T5 + ("SCALE-1", "MASK-1", "MASK-7"),
            AttentionSpec(num_heads=2, head_dim=3, bias=False, scale=1.0, relative=T5Bias(8, 6)),
            Dims(2, 9, 9),
            self_attention=True,
            recipes=(Mask("B11K", dead_keys=1),),
        )
    )
    add(
        Case(
            "t5/cross/encoder-padding",
            T5 + ("SCALE-1", "MASK-1", "MASK-7"),
            AttentionSpec(num_heads=4, head_dim=2, bias=False, scale=1.0, relative=T5Bias(16, 20)),
            CROSS,
            recipes=(Mask("B11K", dead_keys=1),),
        )
    )
    add(
        Case(
            "t5/cross/decoding-step-bottom-right",
            T5 + ("CAUSAL-1", "POS-3"),
            AttentionSpec(num_heads=2, head_dim=2, bias=False, scale=1.0, causal=True, relative=T5Bias(8, 6, False)),
            Dims(2, 1, 9),
            recipes=(Positions("bottom-right"),),
        )
    )

    # T5-4: the smallest configuration accepted, 4 buckets (1 exact distance per side) saturating at 2
    add(
        Case(
            "t5/cross/smallest-configuration",
            T5 + ("T5-4",),
            AttentionSpec(num_heads=1, head_dim=2, relative=T5Bias(4, 2)),
            Dims(1, 3, 6),
            recipes=(Positions("spread-queries"),),
        )
    )

    # ------------------------------------------------------------ Swin (SWIN-1..SWIN-6)
    add(
        Case(
            "swin/self/window-3x4",
            CORE + SWIN + ("PARAM-3",),
            AttentionSpec(num_heads=2, head_dim=4, relative=Swin((3, 4))),
            Dims(2, 12, 12),
            self_attention=True,
        )
    )
    # a window of one column: the multiplier is 2Ww - 1 = 1 (SWIN-3)
    add(
        Case(
            "swin/self/window-4x1",
            SWIN,
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((4, 1))),
            Dims(2, 4, 4),
            self_attention=True,
        )
    )
    add(
        Case(
            "swin/self/window-2x3-class-token",
            SWIN + ("SWIN-4",),
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((2, 3), prefix_tokens=1)),
            Dims(2, 7, 7),
            self_attention=True,
        )
    )
    # SWIN-5: the shifted window's -100 is an additive bias (BIAS-1)
    add(
        Case(
            "swin/self/window-3x4-shift-mask",
            SWIN + ("SWIN-5", "BIAS-1"),
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((3, 4))),
            Dims(2, 12, 12),
            self_attention=True,
            recipes=(Bias("11QK", shift_groups=3),),
        )
    )
    # POS-5: the window's tokens in another order, their coordinates given through positions
    add(
        Case(
            "swin/self/window-3x3-permuted-tokens",
            SWIN + ("POS-5", "SWIN-6"),
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((3, 3))),
            Dims(1, 9, 9),
            self_attention=True,
            recipes=(Positions("permuted"),),
        )
    )
    # positions outside the window: offsets clipped (SWIN-3); prefix tokens at negative positions too
    add(
        Case(
            "swin/cross/outside-window-clipped-prefix2",
            SWIN + ("SWIN-4", "SWIN-6", "POS-5"),
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((2, 2), prefix_tokens=2)),
            CROSS,
            recipes=(Positions("random-per-batch"),),
        )
    )

    # ------------------------------------------------------------ the three biases through every other path
    # The bias is added before the masks and the softmax (REL-3): each family once through ragged masks and
    # -inf biases, the peer options, a long causal sequence, logits near +-1000, and grouped heads with
    # empty rows under causal masking.
    for family, rules, scheme in (
        ("alibi", ALIBI + ("ALIBI-3",), Alibi()),
        ("t5", T5, T5Bias(8, 6)),
        ("swin", SWIN, Swin((2, 3))),
    ):
        add(
            Case(
                f"{family}/cross/ragged-heads-minus-inf-bias",
                rules + ("MASK-1", "MASK-4", "MASK-5", "MASK-7", "BIAS-1", "BIAS-2", "GRAD-2"),
                AttentionSpec(num_heads=2, head_dim=2, relative=scheme),
                CROSS,
                recipes=(
                    Mask("BHQK", density=0.85, empty_cells=RAGGED_ROWS, dead_cells=RAGGED_KEYS),
                    Bias("B11K", neg_inf=0.15, dead_keys=((1, 3),)),
                    Positions("gapped-queries"),
                ),
            )
        )
        add(
            Case(
                f"{family}/cross/peer-options-causal-positions",
                rules + ("SCALE-1", "HEAD-4", "SOFTCAP-1", "WINDOW-1", "MASK-6", "CAUSAL-1", "POS-1"),
                AttentionSpec(
                    num_heads=2,
                    head_dim=2,
                    scale=0.5,
                    value_head_dim=3,
                    softcap=2.0,
                    window=(2, 1),
                    causal=True,
                    mask_fill=MODERATE_FILL,
                    relative=scheme,
                ),
                CROSS,
                recipes=(Positions("per-batch-offsets"),),
            )
        )
        add(
            Case(
                f"{family}/self/causal-long-L512",
                rules + ("CAUSAL-1", "SOFTMAX-1"),
                AttentionSpec(num_heads=1, head_dim=8, causal=True, relative=scheme),
                Dims(1, 512, 512),
                self_attention=True,
                store_weights=False,
                notes="several query tiles of every tiled kernel; weights not stored",
            )
        )
        add(
            Case(
                f"{family}/cross/large-logits",
                rules + ("SOFTMAX-1", "BIAS-1", "PREC-3"),
                AttentionSpec(num_heads=2, head_dim=2, relative=scheme),
                CROSS,
                recipes=(Bias("BHQK", offset=LARGE), Mask("B1QK")),
                dtypes=WIDE,
                notes=WIDE_WHY,
            )
        )
        add(
            Case(
                f"{family}/cross/gqa-causal-mask-empty-rows",
                rules + ("HEAD-3", "MASK-2", "MASK-5", "CAUSAL-1", "POS-1"),
                AttentionSpec(num_heads=4, head_dim=2, num_kv_heads=2, causal=True, relative=scheme),
                CROSS,
                recipes=(Mask("B1QK", empty_rows=1), Positions("random-per-batch")),
            )
        )
    # a decoding-shaped Swin call: the window's last row of queries against all its keys (POS-3)
    add(
        Case(
            "swin/cross/last-row-bottom-right",
            SWIN + ("POS-3",),
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((3, 4))),
            Dims(2, 4, 12),
            recipes=(Positions("bottom-right"),),
        )
    )

    # ------------------------------------------------------------ blockwise evaluation (BLOCK-1..BLOCK-6)
    # The tokens of 2 shards in their load-balanced causal order (chunks 0, 3 | 1, 2) with their global positions,
    # Shaw's value term and a padding mask: a sharded adapter splits the keys (BLOCK-1) and must give every token
    # the unsharded result, and its gradients (BLOCK-6, a ring's backward); any other adapter computes the call whole.
    add(
        Case(
            "blockwise/self/zigzag-causal-shaw-values-padding",
            ("BLOCK-1", "BLOCK-2", "BLOCK-3", "BLOCK-4", "BLOCK-5", "BLOCK-6", "POS-1", "POS-2", "CAUSAL-1", "MASK-5")
            + SHAW,
            AttentionSpec(num_heads=2, head_dim=3, relative=Shaw(3, per_head=True), causal=True),
            Dims(2, 16, 16),
            self_attention=True,
            recipes=(Positions("zigzag"), Mask("B11K", density=0.8)),
        )
    )
    # The same order with mask_fill = -1e9 (BLOCK-2: every key of a block is in the block's statistics, its
    # disallowed logits filled) and rows left without an allowed key: a fully masked row averages every key
    # uniformly (MASK-6), and a combination in the log-sum-exp form rounds at the fill's magnitude (BLOCK-3).
    add(
        Case(
            "blockwise/self/zigzag-causal-mask-fill-empty-rows",
            ("BLOCK-1", "BLOCK-2", "BLOCK-3", "BLOCK-4", "BLOCK-6", "POS-1", "POS-2", "CAUSAL-1", "MASK-6", "GRAD-2"),
            AttentionSpec(num_heads=2, head_dim=3, causal=True, mask_fill=-1e9),
            Dims(2, 16, 16),
            self_attention=True,
            recipes=(Positions("zigzag"), Mask("B1QK", empty_rows=2)),
        )
    )

    # ------------------------------------------------------------ profiles
    add(
        Case(
            "profile/tutorial-mha",
            ("PROF-1", "PROF-2"),
            profiles.tutorial_mha(4, 2),
            Dims(2, 3, 3),
            self_attention=True,
        )
    )
    add(
        Case(
            "profile/einsum-selfattention/masked",
            ("PROF-1", "PROF-3", "MASK-6", "SCALE-1"),
            profiles.einsum_selfattention(12, 3),
            Dims(2, 5, 5),
            recipes=(Mask("B1QK", empty_rows=1),),
        )
    )
    add(
        Case(
            "profile/shaw-rpe/masked",
            ("PROF-1", "PROF-4", "MASK-6") + SHAW,
            profiles.shaw_rpe(12, 2),
            Dims(2, 8, 8),
            recipes=(Mask("B11K", density=1.0, dead_keys=2),),
        )
    )
    add(
        Case(
            "profile/music-relative",
            ("PROF-1", "PROF-5", "SCALE-3") + HUANG,
            profiles.music_relative(12, 3, 6),
            Dims(2, 6, 6),
            self_attention=True,
        )
    )

    # ------------------------------------------------------ argument errors
    c += _combination_cases()
    c += _kernel_cases()

    add(
        Case(
            "errors/mask-not-boolean",
            ("INPUT-1", "MASK-3"),
            V,
            CROSS,
            expect_error="TypeError",
            error_inputs="float-mask",
            dtypes=("float64", "float32"),
        )
    )
    add(
        Case(
            "errors/keep-mask-without-dropout",
            ("INPUT-1", "DROP-2"),
            V,
            CROSS,
            expect_error="ValueError",
            error_inputs="keep-without-dropout",
            dtypes=("float64", "float32"),
        )
    )
    add(
        Case(
            "errors/params-missing-entry",
            ("INPUT-1", "PARAM-2"),
            S2,
            CROSS,
            expect_error="ValueError",
            error_inputs="params-missing",
            dtypes=("float64", "float32"),
        )
    )
    add(
        Case(
            "errors/positions-not-integer",
            ("INPUT-1", "POS-1"),
            S2,
            CROSS,
            expect_error="TypeError",
            error_inputs="float-positions",
            dtypes=("float64", "float32"),
        )
    )
    for kind, error, rules, spec in (
        ("int-mask", "TypeError", ("MASK-3",), V),
        ("mask-B-Lk", "ValueError", ("MASK-1",), V),
        ("mask-wrong-size", "ValueError", ("MASK-1",), V),
        ("keep-not-boolean", "TypeError", ("DROP-1",), P),
        ("keep-broadcast", "ValueError", ("DROP-1",), P),
        ("params-extra", "ValueError", ("PARAM-2",), S2),
        ("params-misshaped", "ValueError", ("PARAM-2",), V),
        ("params-kv-heads-square", "ValueError", ("PARAM-2", "HEAD-3"), AttentionSpec(4, 2, num_kv_heads=2)),
        ("positions-wrong-length", "ValueError", ("POS-1",), S2),
    ):
        add(
            Case(
                f"errors/{kind}",
                ("INPUT-1",) + rules,
                spec,
                CROSS,
                expect_error=error,
                error_inputs=kind,
                dtypes=("float64", "float32"),
            )
        )
    # what only the reference's entry points promise (REFERENCE_FEATURES in conformance/adapters/base.py)
    for kind, error, rules, needs in (
        ("bias-nan", "ValueError", ("BIAS-2",), "rejects-bad-bias-values"),
        ("bias-plus-inf", "ValueError", ("BIAS-2",), "rejects-bad-bias-values"),
        ("grad-out-integer", "TypeError", ("GRAD-1",), "validates-vjp-input"),
        ("grad-out-misshaped", "ValueError", ("GRAD-1",), "validates-vjp-input"),
    ):
        add(
            Case(
                f"errors/reference/{kind}",
                ("INPUT-1",) + rules,
                V,
                CROSS,
                expect_error=error,
                error_inputs=kind,
                dtypes=("float64", "float32"),
                extra_features=frozenset({needs}),
            )
        )
    return c


def _combination_cases() -> list[Case]:
    """The cases that fill coverage's combinations table (conformance/coverage.py: SUBJECTS x AXES): each
    scheme and option also in a decode step (one query after a cache of keys, POS-3) and past every kernel's
    first query tile (Lq, Lk >= 512), where no case of its own chapter puts it. Each combines several
    options, so that a rule exercised only with one setting elsewhere is exercised in the other here."""
    c = []
    add = c.append
    decode = Dims(2, 1, 24)  # the query at position 23, after keys 0 .. 23 (bottom-right, POS-3)
    # decode steps: the window and the padding cut the cache; grouped heads read their group's key
    add(
        Case(
            "decode/vanilla/window-gqa-padding",
            CORE + ("POS-3", "CAUSAL-1", "WINDOW-1", "HEAD-3", "MASK-2", "MASK-7"),
            AttentionSpec(num_heads=4, head_dim=4, num_kv_heads=2, causal=True, window=(8, 0)),
            decode,
            recipes=(Positions("bottom-right"), Mask("B11K", dead_keys=3)),
        )
    )
    # every term of Shaw at once, beyond its clip distance, unscaled, per head, with every peer option
    add(
        Case(
            "decode/shaw/k3-key-side-values-per-head-unscaled-gqa-dv-softcap-window-dropout",
            REL
            + SHAW
            + ("SHAW-5", "SHAW-6", "SHAW-7", "POS-3", "CAUSAL-1", "WINDOW-1", "HEAD-3", "HEAD-4", "SOFTCAP-1")
            + ("DROP-1", "DROP-4", "MASK-2", "BIAS-1"),
            AttentionSpec(
                num_heads=4,
                head_dim=2,
                num_kv_heads=2,
                value_head_dim=3,
                softcap=2.0,
                window=(12, 0),
                causal=True,
                scale_relative=False,
                dropout=0.25,
                relative=Shaw(3, per_head=True, key_side="shared"),
            ),
            decode,
            recipes=(Positions("bottom-right"), Mask("B1QK"), Bias("B1QK"), Keep()),
        )
    )
    # Huang's key and value terms beyond the table (HUANG-3, HUANG-6), the masked keys filled (MASK-6)
    add(
        Case(
            "decode/huang/M8-values-mask-fill-bias",
            REL + HUANG + ("HUANG-3", "HUANG-6", "POS-3", "CAUSAL-1", "MASK-2", "MASK-6", "BIAS-1", "GRAD-2"),
            AttentionSpec(
                num_heads=2, head_dim=4, causal=True, mask_fill=MODERATE_FILL, relative=Huang(8, values=True)
            ),
            decode,
            recipes=(Positions("bottom-right"), Mask("B11K", density=0.7), Bias("B1QK")),
        )
    )
    # long, not causal: a two-sided window over 512 tokens, every Shaw term, one key/value head, a custom
    # scale, padding by the mask and by a -inf bias, dropout; the masks and biases are broadcast over queries
    # or batch to stay small
    long = Dims(1, 512, 512)
    add(
        Case(
            "long/shaw/k4-own-key-side-values-mqa-dv-softcap-window-dropout-padding-L512",
            REL
            + SHAW
            + ("SHAW-5", "SHAW-6", "SHAW-7", "SCALE-1", "WINDOW-1", "HEAD-3", "HEAD-4", "SOFTCAP-1")
            + ("DROP-1", "DROP-4", "MASK-2", "MASK-7", "BIAS-1", "BIAS-2"),
            AttentionSpec(
                num_heads=2,
                head_dim=2,
                num_kv_heads=1,
                value_head_dim=3,
                scale=0.6,
                softcap=2.0,
                window=(40, 24),
                scale_relative=False,
                dropout=0.25,
                relative=Shaw(4, key_side="own"),
            ),
            long,
            self_attention=True,
            store_weights=False,
            recipes=(Mask("B11K", dead_keys=5), Bias("B11K", dead_keys=((0, 3),)), Keep()),
            notes="past every kernel's first query tile; weights not stored",
        )
    )
    # long, causal, shifted positions, no projection biases: Huang's value term and a moderate mask_fill
    add(
        Case(
            "long/huang/M64-values-causal-mask-fill-no-projection-bias-L512",
            REL + HUANG + ("HUANG-3", "HUANG-6", "PROJ-1", "POS-4", "CAUSAL-1", "MASK-2", "MASK-6"),
            AttentionSpec(
                num_heads=2,
                head_dim=4,
                bias=False,
                causal=True,
                mask_fill=MODERATE_FILL,
                relative=Huang(64, values=True),
            ),
            long,
            self_attention=True,
            store_weights=False,
            recipes=(Mask("B11K", dead_keys=4), Positions("shifted")),
            notes="past every kernel's first query tile; weights not stored",
        )
    )
    return c


def _kernel_cases() -> list[Case]:
    """Inputs that tell a fast kernel's mistakes apart where the other cases cannot (found by the mutation campaign
    over torch_impl's kernels: each case kills mutants of a tiling, a fused call or a shared table helper that
    every other case survives). Small shapes, every dtype."""
    c = []
    add = c.append
    C = replace(V, causal=True)
    # HEAD-3 where B = H = Lk and Hkv = Lq: an axis read in place of another has the right size
    add(
        Case(
            "peer/gqa/cross/b4-h4-kv2-lq2-lk4",
            CORE + ("HEAD-3",),
            AttentionSpec(num_heads=4, head_dim=2, num_kv_heads=2),
            Dims(4, 2, 4),
        )
    )
    # WINDOW-1 with a right bound larger than the left one, over a bias family at default positions
    add(
        Case(
            "alibi/self/window-1-2",
            ALIBI + ("WINDOW-1",),
            AttentionSpec(num_heads=2, head_dim=2, window=(1, 2), relative=Alibi()),
            Dims(2, 8, 8),
            self_attention=True,
        )
    )
    # CAUSAL-1 at default positions with a bias whose first row is all -inf (BIAS-2, MASK-5): the causal
    # diagonal block alone cannot say which rows are empty
    add(
        Case(
            "causal/self/bias-minus-inf-row",
            ("CAUSAL-1", "BIAS-1", "BIAS-2", "MASK-4", "MASK-5", "GRAD-2"),
            C,
            Dims(2, 6, 6),
            self_attention=True,
            recipes=(Bias("B1QK", empty_rows=1),),
        )
    )
    # CAUSAL-1 top-left, more queries than keys: queries past the last key attend every key
    add(Case("causal/cross/lq8-lk5-top-left", ("CAUSAL-1", "POS-1"), C, Dims(2, 8, 5)))
    # MASK-6 under a plain causal rule (no mask, no bias, default positions): the keys after a query keep the
    # moderate fill's weight, so a kernel that cuts them off as it may under MASK-5 changes every row but the last
    add(
        Case(
            "mask-fill/moderate/causal-plain",
            ("MASK-6", "CAUSAL-1", "GRAD-1"),
            replace(C, mask_fill=-1.5),
            Dims(2, 6, 6),
            self_attention=True,
        )
    )
    # CAUSAL-1 top-left with a window's left bound (WINDOW-1) and more queries than keys: query i keeps the keys
    # i - 1 .. i, so the last query (i = Lk + 1) has none (MASK-5), a row that no causal rule alone empties, and
    # the one before it keeps one key: a kernel's test for empty rows is off by one if either side changes
    add(
        Case(
            "peer/window/cross/causal-left1-empty-last-row",
            ("CAUSAL-1", "WINDOW-1", "POS-1", "MASK-5", "MASK-7", "GRAD-2"),
            replace(C, window=(1, None)),
            Dims(2, 5, 3),
        )
    )
    # SHAW-6 with a table shared by heads and grouped key/value heads (HEAD-3)
    add(
        Case(
            "shaw-key-side/k2/cross/shared-table-gqa",
            REL + SHAW + ("SHAW-6", "SHAW-7", "HEAD-3"),
            AttentionSpec(num_heads=4, head_dim=2, num_kv_heads=2, relative=Shaw(2, key_side="shared")),
            CROSS,
        )
    )
    # SHAW-5 with max_distance 0 and a tile of one query: the band between the two clipped regions is empty
    # (rows + 2k - 2 < 0 columns), every key reads the table's one row, and its gradient is a cancelling sum
    add(Case("shaw/k0/cross/lq1", REL + SHAW + ("SHAW-5",), replace(S2, relative=Shaw(0)), Dims(2, 1, 5)))
    # ROPE-7: an attention factor multiplies cos and sin
    add(
        Case(
            "rope/half/cross/attention-factor-2",
            ROPE + ("ROPE-7",),
            AttentionSpec(num_heads=2, head_dim=4, relative=Rope(attention_factor=2.0)),
            CROSS,
        )
    )
    # SWIN-2, SWIN-4: a prefix token and a 2 x 2 window of four tokens, no mask
    add(
        Case(
            "swin/self/window-2x2-prefix1-L4",
            SWIN + ("SWIN-4",),
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((2, 2), prefix_tokens=1)),
            Dims(2, 4, 4),
            self_attention=True,
        )
    )
    # SWIN-3 where the call is not one whole window: three queries against a window's four keys, and two tokens
    # of a 4 x 2 window (2 = Wh / Ww, not Wh * Ww)
    add(
        Case(
            "swin/cross/window-2x2-lq3-lk4",
            SWIN,
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((2, 2))),
            Dims(2, 3, 4),
        )
    )
    add(
        Case(
            "swin/self/window-4x2-L2",
            SWIN,
            AttentionSpec(num_heads=2, head_dim=2, relative=Swin((4, 2))),
            Dims(2, 2, 2),
            self_attention=True,
        )
    )
    return c


CASES: tuple[Case, ...] = tuple(_cases())
BY_ID = {case.id: case for case in CASES}
assert len(BY_ID) == len(CASES), "case ids must be unique"
