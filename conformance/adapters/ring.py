"""``jax:ring`` and ``torch:ring``: ring (sequence-parallel) attention judged against the same goldens and budgets
as every other adapter (BLOCK-1..BLOCK-5).

Each call is split over n shards with its *global* positions: ``jax_impl.ring_attention`` on n of 8 host devices
(``--xla_force_host_platform_device_count=8``, n in 2, 4, 8), ``torch_impl.ring_attention`` on n of 4 gloo
processes (n in 2, 4). Causal specs take the load-balanced layout (``zigzag``, BLOCK-5), the others
``contiguous``; n is fixed per call by a hash of its spec and shapes, so that the catalog meets every count.

A length that is not a multiple of the shard unit (n, 2n for zigzag) is padded: extra query rows (their output
dropped, their gradient 0) and extra keys that no query may attend (a mask False in their columns, MASK-4), so
the padded call's rows equal the case's (MASK-5 and MASK-7: a shard may hold nothing but padding, a fully
masked block). Padding happens inside the differentiated function: every gradient is of the case's own
inputs. Under ``mask_fill`` (MASK-6) a disallowed key still counts, so there n divides Lk or the call is
skipped with that reason.

The rings run in processes of their own (JAX fixes its host devices when it starts; gloo needs one process
per rank), started at the first call and fed over pipes; an exception raised there is raised here.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import zlib
from typing import ClassVar, Optional

import numpy as np

from . import _jax, _torch
from .base import FEATURES, Adapter, Capabilities

#: What a ring adapter cannot be asked for (KERN-1 aside: the rings have no kernel choice).
RING_MISSING = {
    "dropout-spec": "ring_attention takes an explicit keep mask only (DROP-1), no random dropout",
    "validates-input": "the harness pads and shards a call before ring_attention sees it; the argument checks "
    "are certified on jax and torch",
}
DIFF = ("query", "key", "value", "bias")


def layout_of(spec) -> str:
    return "zigzag" if spec.causal else "contiguous"


def _unit(spec, n: int, layout: Optional[str] = None) -> int:
    """The shard unit: n, 2n for the zigzag layout (``layout`` None: the spec's, ``layout_of``)."""
    return 2 * n if (layout or layout_of(spec)) == "zigzag" else n


def shard_count(spec, Lq: int, Lk: int, counts: tuple) -> Optional[int]:
    """The call's number of shards: one of ``counts`` by a hash of the spec and the lengths (deterministic); under
    ``mask_fill`` the first in that order whose unit divides Lk, None if none does."""
    start = zlib.crc32(repr((spec, Lq, Lk)).encode()) % len(counts)
    order = counts[start:] + counts[:start]
    if spec.mask_fill is None:
        return order[0]
    return next((n for n in order if Lk % _unit(spec, n) == 0), None)


def mask_fill_reason(spec, Lk: int, counts: tuple) -> str:
    units = ", ".join(str(_unit(spec, n)) for n in counts)
    return (
        f"mask_fill counts every key (MASK-6), so the keys cannot be padded, and Lk = {Lk} is a multiple of no "
        f"shard unit ({units})"
    )


def lengths(inputs: dict) -> tuple:
    return inputs["query"].shape[1], inputs.get("key", inputs["query"]).shape[1]


def padded_lengths(spec, inputs: dict, n: int, layout: Optional[str] = None) -> tuple:
    """(Lq, Lk, Lq2, Lk2): the call's lengths and the padded ones (multiples of the shard unit)."""
    unit = _unit(spec, n, layout)
    Lq, Lk = lengths(inputs)
    return Lq, Lk, -(-Lq // unit) * unit, -(-Lk // unit) * unit


def pad_inputs(spec, inputs: dict, n: int, layout: Optional[str] = None) -> dict:
    """The call's inputs that are not differentiated, padded (NumPy): positions (the last one repeated, its
    dtype kept), the mask (False in the padded key columns; made when the case has none) and the keep mask, each
    pair input broadcast to (B|1, H|1, Lq2, Lk2)."""
    Lq, Lk, Lq2, Lk2 = padded_lengths(spec, inputs, n, layout)
    out = {}
    for name, L, L2 in (("q_positions", Lq, Lq2), ("k_positions", Lk, Lk2)):
        p = inputs.get(name)
        if p is None:
            p = np.arange(L)
        out[name] = np.concatenate([p, np.repeat(p[..., -1:], L2 - L, axis=-1)], axis=-1)
    for name, fill in (("mask", False), ("dropout_keep", True)):
        a = inputs.get(name)
        if a is None and not (name == "mask" and Lk2 > Lk):
            continue
        a = np.ones((1, 1, Lq, Lk), bool) if a is None else np.asarray(a)
        a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
        a4 = np.broadcast_to(a4, a4.shape[:2] + (Lq, Lk))
        out[name] = np.pad(a4, ((0, 0), (0, 0), (0, Lq2 - Lq), (0, Lk2 - Lk)), constant_values=fill)
    return out


def bias_padding(bias_shape: tuple, Lq: int, Lk: int, Lq2: int, Lk2: int) -> list:
    """The pad widths of the bias as rank 4: its query and key axes grow where they are full (a broadcast axis of
    size 1 stays: the padded keys are masked, the padded rows dropped)."""
    shape = (1,) * (4 - len(bias_shape)) + tuple(bias_shape)
    return [(0, 0), (0, 0), (0, Lq2 - Lq if shape[2] == Lq and Lq > 1 else 0), (0, Lk2 - Lk if shape[3] == Lk else 0)]


#: Seconds a ring may take to answer one call before its workers are stopped (a rank that failed while the
#: others wait for its blocks would otherwise hang the run).
REPLY_TIMEOUT = 600


class _Workers:
    """Processes that serve calls over pipes: started at the first call, stopped at exit."""

    def __init__(self, target, count: int):
        self.target, self.count, self.pipes, self.procs = target, count, [], []

    def start(self):
        if self.procs:
            return
        context = multiprocessing.get_context("spawn")
        address = os.path.join(_jax._compilation_cache(), f"ring-{os.getpid()}-{id(self)}")
        for rank in range(self.count):
            here, there = context.Pipe()
            proc = context.Process(target=self.target, args=(there, rank, self.count, address), daemon=True)
            proc.start()
            self.pipes.append(here)
            self.procs.append(proc)
        atexit.register(self.stop)

    def call(self, message, ranks: int):
        """The message to every worker; the replies of the first ``ranks``. An exception raised there is raised."""
        self.start()
        for pipe in self.pipes:
            pipe.send(message)
        replies = []
        for pipe in self.pipes:
            if not pipe.poll(REPLY_TIMEOUT):
                self.stop(kill=True)
                raise TimeoutError(f"a ring worker gave no answer in {REPLY_TIMEOUT} s; the workers were stopped")
            replies.append(pipe.recv())
        for status, value in replies:
            if status == "error":
                raise value
        return [value for _, value in replies[:ranks]]

    def stop(self, kill: bool = False):
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            if kill:
                proc.kill()
            proc.join(timeout=10)
        self.pipes, self.procs = [], []


def _serve(conn, handle):
    """A worker's loop: each message through ``handle``, the result or the exception sent back."""
    while True:
        message = conn.recv()
        if message is None:
            return
        try:
            conn.send(("ok", handle(*message)))
        except Exception as e:  # noqa: BLE001 - the harness judges it (error cases, failures)
            conn.send(("error", e))


class _RingAdapter(Adapter):
    counts: ClassVar[tuple]
    workers: ClassVar[int]

    def __init__(self):
        self._workers = None

    def capabilities(self):
        return Capabilities(devices=("cpu",), features=FEATURES - set(RING_MISSING), weights=False, notes=RING_MISSING)

    def unsupported_case(self, case):
        if case.spec.mask_fill is not None and shard_count(case.spec, case.dims.Lq, case.dims.Lk, self.counts) is None:
            return mask_fill_reason(case.spec, case.dims.Lk, self.counts)
        return None

    def _pool(self) -> _Workers:
        if self._workers is None:
            self._workers = _Workers(self.worker, self.workers)
        return self._workers

    def shards(self, spec, inputs: dict) -> int:
        n = shard_count(spec, *lengths(inputs), self.counts)
        if n is None:
            raise NotImplementedError(mask_fill_reason(spec, lengths(inputs)[1], self.counts))
        return n

    def _ask(self, kind, spec, params, inputs, grad_out):
        n = self.shards(spec, inputs)
        return self._pool().call((kind, spec, params, inputs, grad_out, n), self.ranks(n))

    def ranks(self, n: int) -> int:
        return 1

    def forward(self, spec, params, inputs, *, device, need_weights):
        return {"out": self._ask("forward", spec, params, inputs, None)[0]["out"]}

    def forward_only(self, spec, params, inputs, *, device):
        return {"out": self._ask("forward_only", spec, params, inputs, None)[0]["out"]}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        return self._ask("vjp", spec, params, inputs, grad_out)[0]


# ---------------------------------------------------------------- JAX: one process, 8 host devices
class JaxRingAdapter(_RingAdapter):
    name = "jax:ring"
    description = (
        "jax_impl.ring_attention under jax.jit on 2, 4 or 8 of 8 host devices (shard_map, ppermute), global "
        "positions, zigzag when causal; gradients by jax.vjp"
    )
    counts = (2, 4, 8)
    workers = 1

    def unavailable(self):
        return _jax.jax_available()

    def capabilities(self):
        caps = super().capabilities()
        return Capabilities(**{**caps.__dict__, "unsupported": dict(_jax.UNSUPPORTED)})

    def environment(self):
        return {**self._pool().call(("environment", None, None, None, None, None), 1)[0], "shards": self.counts}

    @staticmethod
    def worker(conn, rank, count, address):
        serve_on_host_devices(conn, _jax_handle)


def serve_on_host_devices(conn, handle):
    """A JAX worker's loop (``_serve``) in a process of 8 host devices, set before JAX starts."""
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]
    ).strip()
    _jax.setup()
    _serve(conn, handle)


def _jax_handle(kind, spec, params, inputs, grad_out, n):
    import jax

    from .jax_impl_adapter import omitted_inputs

    if kind == "environment":
        return {**_jax.setup(), "host_devices": len(jax.devices("cpu"))}
    x = inputs["query"]
    precision = _jax.matmul_precision(x.dtype.name)
    lengths = padded_lengths(spec, inputs, n)
    # NumPy arrays, not committed to one device: the program places them on its mesh
    other = pad_inputs(spec, inputs, n)
    if kind == "forward_only":
        called = {k: inputs[k] for k in DIFF if k in inputs}
        return {"out": np.asarray(_jax_program(spec, n, precision, lengths, None)(params, called, other))}
    # the forward and the gradients of a case are one program (the forward's key and value, omitted or not,
    # recognised as in jax_impl's adapter), run for each of the two calls
    omitted, full = omitted_inputs(inputs)
    called = {k: full[k] for k in DIFF if k in full and k not in omitted}
    g = np.zeros(x.shape, x.dtype) if grad_out is None else grad_out
    out, (g_params, g_inputs) = _jax_program(spec, n, precision, lengths, omitted)(params, called, other, g)
    if kind == "forward":
        return {"out": np.asarray(out)}
    return {k: np.asarray(a) for k, a in {**g_params, **g_inputs}.items()}


@functools.lru_cache(maxsize=64)
def _jax_program(spec, n, precision, lengths, omitted):
    """The padded ring call, jitted: ``out = f(params, called, other)`` with ``omitted`` None; else ``(out, grads)
    = f(params, called, other, g)``, the gradients of the inputs the call omits (SHAPE-2) as leaves of their own."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh

    import jax_impl
    from jax_impl.masking import as4d

    from .jax_impl_adapter import _explicit

    Lq, Lk, Lq2, Lk2 = lengths
    mesh = Mesh(np.array(jax.devices("cpu")[:n]), ("seq",))

    def call(params, diff, other):
        def rows(a, L2):
            return None if a is None else jnp.pad(a, ((0, 0), (0, L2 - a.shape[1]), (0, 0)))

        bias = diff.get("bias")
        if bias is not None:
            widths = bias_padding(bias.shape, Lq, Lk, Lq2, Lk2)
            bias = jnp.pad(as4d(bias), widths)
        with jax.default_matmul_precision(precision):
            out = jax_impl.ring_attention(
                spec, params, rows(diff["query"], Lq2), rows(diff.get("key"), Lk2), rows(diff.get("value"), Lk2),
                mesh=mesh, axis_name="seq", bias=bias, layout=layout_of(spec), **other,
            )  # fmt: skip
        return out[:, :Lq]

    if omitted is None:
        return jax.jit(call)

    def both(params, called, other, g):
        out, pullback = jax.vjp(lambda p, d: call(p, d, other), params, _explicit(called, omitted))
        return (call(params, called, other) if omitted else out), pullback(g)

    return jax.jit(both)


# ---------------------------------------------------------------- PyTorch: 4 gloo processes
class TorchRingAdapter(_RingAdapter):
    name = "torch:ring"
    description = (
        "torch_impl.ring_attention over gloo process groups of 2 or 4 ranks (point-to-point send/recv), global "
        "positions, zigzag when causal; gradients by its backward ring (BLOCK-6), summed over the ranks"
    )
    counts = (2, 4)
    workers = 4

    def unavailable(self):
        return _torch.torch_available()

    def ranks(self, n: int) -> int:
        return n

    def environment(self):
        return {**_torch.pin_numerics(), "backend": "gloo", "shards": self.counts}

    def forward(self, spec, params, inputs, *, device, need_weights):
        Lq, _, Lq2, _ = padded_lengths(spec, inputs, self.shards(spec, inputs))
        parts = self._ask("forward", spec, params, inputs, None)
        out = np.zeros((parts[0][1].shape[0], Lq2) + parts[0][1].shape[2:], parts[0][1].dtype)
        for tokens, rows in parts:
            out[:, tokens] = rows
        return {"out": out[:, :Lq]}

    def forward_only(self, spec, params, inputs, *, device):
        return self.forward(spec, params, inputs, device=device, need_weights=False)

    def vjp(self, spec, params, inputs, grad_out, *, device):
        parts = self._ask("vjp", spec, params, inputs, grad_out)
        total = {k: sum(part[k].astype(np.float64) for part in parts) for k in parts[0]}
        return {k: g.astype(parts[0][k].dtype) for k, g in total.items()}

    @staticmethod
    def worker(conn, rank, count, address):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        _torch.pin_numerics()
        dist.init_process_group("gloo", init_method=f"file://{address}", rank=rank, world_size=count)
        groups = {count: None, 2: dist.new_group([0, 1])}
        _serve(conn, functools.partial(_torch_handle, rank, groups))


def _torch_handle(rank, groups, kind, spec, params, inputs, grad_out, n):
    """This rank's part: its output rows and their tokens, or its share of every gradient (summed by the caller)."""
    import torch
    import torch.nn.functional as F

    import torch_impl
    from torch_impl._core import as_4d
    from torch_impl.ring import shard_tokens

    if rank >= n:
        return None
    layout = layout_of(spec)
    Lq, Lk, Lq2, Lk2 = padded_lengths(spec, inputs, n)
    grads = kind == "vjp"
    called = {**params, **{k: inputs[k] for k in DIFF if k in inputs}}
    leaves = {k: _torch.to_torch(a, "cpu", grads) for k, a in called.items()}
    other = {k: torch.as_tensor(a) for k, a in pad_inputs(spec, inputs, n).items()}
    tq, tk = shard_tokens(Lq2, n, rank, layout), shard_tokens(Lk2, n, rank, layout)

    def rows(name, L2, tokens):
        a = leaves.get(name)
        return None if a is None else F.pad(a, (0, 0, 0, L2 - a.shape[1]))[:, tokens]

    kw = {
        "q_positions": other["q_positions"][..., tq],
        "k_positions": other["k_positions"][..., tk],
        **{k: other[k][:, :, tq] for k in ("mask", "dropout_keep") if k in other},
    }
    if "bias" in leaves:
        b = leaves["bias"]
        widths = bias_padding(tuple(b.shape), Lq, Lk, Lq2, Lk2)
        b4 = F.pad(as_4d(b), [w for pair in reversed(widths) for w in pair])
        kw["bias"] = b4[:, :, tq] if b4.shape[2] == Lq2 else b4
    group = groups[n]
    out = torch_impl.ring_attention(
        spec, {k: leaves[k] for k in params}, rows("query", Lq2, tq), rows("key", Lk2, tk), rows("value", Lk2, tk),
        group=group, layout=layout, **kw,
    )  # fmt: skip
    if not grads:
        return tq.numpy(), _torch.to_numpy(out.detach())
    g = F.pad(_torch.to_torch(grad_out, "cpu"), (0, 0, 0, Lq2 - Lq))[:, tq]
    out.backward(g)
    return {k: _torch.to_numpy(t.grad if t.grad is not None else torch.zeros_like(t)) for k, t in leaves.items()}
