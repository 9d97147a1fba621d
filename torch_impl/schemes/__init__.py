"""Position schemes in PyTorch: one module per scheme, found by ``scheme.name`` (REL-3, REL-4).

A scheme (``spec.Shaw``, ``spec.Huang``, ``spec.Rope``, ``spec.Alibi``, ...) says
*what* it adds through the hooks it lists in ``scheme.hooks`` (from
``spec.HOOKS``); its module here says how. Kernels (``torch_impl.kernels``) call the hooks and never
look at the scheme's type; a kernel whose call site for a hook is missing
says so through its ``unsupported`` (KERN-1).

Hook protocol. ``params`` is the canonical dict of tensors; ``delta`` the
int64 distances (1|B, Lq, Lk) (POS-2). Axis legend (AXES-1): B, H, Lq, Lk, d;
dv the value head dim (HEAD-4), the columns of a value-side table. The
key-term and value-term hooks see the H query heads only: with grouped
key/value heads (HEAD-3) a per-head table still has one table per query head.

Eager hooks (the readable algorithms, whole (B, H, Lq, Lk) arrays):

- ``key_term(scheme, params, q, delta) -> (B, H, Lq, Lk)`` from q (B, H, Lq, d),
  before the factor s_rel (SCALE-3) that the kernel applies;
- ``key_side_term(scheme, params, k, delta, *, group) -> (B, H, Lq, Lk)`` from
  the key heads k (B, Hkv, Lk, d), G = ``group`` query heads per key head
  (HEAD-3), before the factor ``spec.key_side_scale`` (SHAW-7) that the
  kernel applies (Shaw's key side, SHAW-6);
- ``value_term(scheme, params, w, delta) -> (B, H, Lq, dv)`` from the weights
  after dropout w' (B, H, Lq, Lk) (DROP-4), added to ``w' @ v``.

Tile hooks (called by the tiles kernel for one call, then per tile; a tile
has the fields ``b``, ``h`` (slices of batches and heads), ``q0``, ``q1``
(its queries), ``k1`` (its keys 0 .. k1 - 1), ``part`` (the index of its
(b, h, queries) block) and ``cut(t, lead)`` (a broadcastable tensor sliced
to the tile)):

- ``tile_state(scheme, params, q, call, *, causal, rows, stat) -> state``,
  once per call; q (B, H, Lq, d) the queries the key term sees (s_rel
  already folded in, SCALE-3); ``call`` the kernels' ``_core.Call``
  (positions, ``delta``); ``causal`` whether the kernel masks every key
  after the diagonal (CAUSAL-1), so the term may be anything finite there;
  ``rows`` the most queries of a tile; ``stat`` the weights' dtype (PREC-4);
- ``tile_key_term(state, tile, ws) -> (b, h, T, k1)`` with s_rel included,
  ``ws`` a ``Workspace`` or None;
- ``tile_value_term(state, w, tile) -> (b, h, T, dv)`` (the kernel casts it to the output dtype) from the tile's
  weights after dropout (b, h, T, k1);
- ``key_side_state(scheme, params, k, call, *, group) -> state`` once per
  call, k (B, Hkv, Lk, d) with the key-side factor folded in (SHAW-7), and
  ``tile_key_side_term(state, tile) -> (b, h, T, k1)``.

Transform hook (every kernel calls it once per call, after the head split
and before any logit, REL-3 (1); the tiles kernel before its first tile):

- ``qk_transform(scheme, params, q, k, q_positions, k_positions) -> (q, k)``,
  q (B, H, Lq, d) and k (B, Hkv, Lk, d) (HEAD-3: k keeps its key/value
  heads), positions (1|B, Lq) and (1|B, Lk) int64 (POS-1, the defaults
  filled in); the same shapes and dtypes come back (RoPE, ``rope.py``). The
  kernels' shared call site is ``kernels._base.transform_qk``.

Bias hooks (REL-3 (3): a per-head scalar of the positions, added to the
logits unscaled after the soft cap and before the ``bias`` input, SCALE-4;
ALiBi, T5, Swin). The result is in ``stat``, the dtype of the logits:
float32 for float16 and bfloat16 inputs, else the input dtype (PREC-4);
tables are read in the compute dtype and widened, never the other way.
Gradients reach the tables through autograd (an index read, whose backward
is a scatter-add); nothing loops over positions.

- ``bias(scheme, params, call, *, num_heads, stat) -> (1|B, H, Lq, Lk)``,
  ``call`` the kernels' ``_core.Call`` (its ``delta``, and its positions
  through ``_core.positions``), ``num_heads`` H (ALiBi's slopes depend on
  it). The eager and sdpa kernels call it once per call, through
  ``kernels._base.scheme_bias``;
- optionally ``distance_bias(scheme, params, call, *, num_heads, stat) ->
  (1, H, Lq + Lk - 1)``, for a scheme whose bias depends on delta alone
  (ALiBi, T5), at default positions only: the bias of every distance
  -(Lq - 1) .. Lk - 1 once (``_bias_tables.call_distances``). The sdpa
  kernel hands SDPA its strided (Lq, Lk) view, rows in reverse query order,
  so no (H, Lq, Lk) bias is written; the eager kernel lays them out in order
  (``kernels._base.scheme_bias``, ``by_distance``) instead of calling ``bias``;
- optionally ``reversed_bias(scheme, params, call, *, num_heads, stat,
  workspace=None) -> (1, H, Lq, Lk) | None``, for a bias that is a strided
  view of a small table once the queries run in reverse order (Swin's one
  whole window): that bias with row t holding query Lq - 1 - t, written
  into a buffer of ``workspace`` when one is given (a call that records no
  gradient), None for calls it does not cover. The sdpa kernel runs SDPA on
  the reversed queries with it (``kernels._base.scheme_reversed_bias``);
- ``tile_bias(state, tile) -> (1|b, h, T, k1)``, per tile, in ``stat``: the
  bias of the tile's batches, heads, queries and keys (``state`` from the
  scheme's ``tile_state`` above, whose q gives H and the device), so the
  tiles kernel never builds a (B, H, Lq, Lk) bias
  (``_bias_tables.tile_positions``).

Score hooks (the flex kernel: FlexAttention calls its ``score_mod`` per
pair, with 0-d int tensors b, h, i, j; only pointwise operations compile
there, so the hooks read small tensors and never reshape):

- ``score_state(scheme, params, q, call, *, stat) -> state``, once per
  call; q (B, H, Lq, d) as the key term sees it (s_rel folded in, SCALE-3);
  a key term's state holds its (B, H, Lq, R) table logits
  (``_tables.key_score_state``), a bias's the tiles' state;
- ``score_term(state, b, h, i, j) -> 0-d`` in ``stat``: the key term of
  the pair (s_rel included) for Shaw and Huang, the bias of the pair for
  ALiBi, T5 and Swin; the pair's positions come from
  ``_bias_tables.pair_positions``;
- ``key_side_score_state(scheme, params, k, call, *, group, stat)`` and
  ``key_side_score_term(state, b, h, i, j)``: the same for a key-side term
  (SHAW-6), k (B, Hkv, Lk, d) with its factor folded in (SHAW-7);
- optionally ``value_distances(scheme) -> (lo, hi, edges)``, for a value
  term the flex kernel computes from FlexAttention's log-sum-exp (the
  weights never leave it): at default positions the distances lo .. hi
  have one key per query and their own table rows, in order (from row 1
  with edges, else from row 0); with ``edges``, row 0 takes every distance
  < lo and row R - 1 every distance > hi (Shaw's clipped rows, SHAW-2). A
  scheme without it has no value term in the flex kernel.

Fused hooks (the triton kernel: one Triton program computes the terms from
tables, at positions that are runs of consecutive integers):

- ``fused_unsupported(scheme) -> Optional[str]``: why this configuration of
  the scheme cannot be fused (None: it can); a scheme without the hook is
  not fused at all;
- ``fused_tables(scheme, params) -> (rel_k | None, rel_v | None, k)``: the
  key and value tables, (R, c) or (H, R, c), read by ``clip(j - i, -k, k)
  + k`` (Shaw, SHAW-2; Huang's with a zero row at each end, so that every
  distance beyond its table reads zero, HUANG-3);
- ``fused_rows(scheme) -> int``: the rows of those tables (the kernel
  refuses more than it holds);
- ``fused_pair_table(scheme, params) -> (table (H, R), window, prefix)``:
  a bias read from a table at rows the program computes from both
  positions (Swin, SWIN-3, SWIN-4).

A later scheme adds one module and, for a hook kind no module has used yet,
one call site per kernel.
"""

from __future__ import annotations

from spec.schemes import ModuleRegistry

from . import alibi, huang, rope, shaw, swin, t5

__all__ = ["REGISTRY", "module_for", "register_module"]

#: scheme name -> its torch_impl module (REL-4).
REGISTRY = ModuleRegistry(
    "torch_impl", {"shaw": shaw, "huang": huang, "rope": rope, "alibi": alibi, "t5": t5, "swin": swin}
)
register_module = REGISTRY.register_module
module_for = REGISTRY.module_for
