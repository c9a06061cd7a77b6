r"""Small dense factorizations batched across the leaf groups of one update.

A GPU or TPU pays a fixed latency for every call into its dense linear-algebra library
(cuSOLVER's ``syevd``, ``geqrf``, ``orgqr``): tens of microseconds, whatever the matrix's size,
against the ``O(n^3)`` flops of the ``11 x 11`` Gram matrix of an FD sketch. The driver
(:mod:`sketchopt._leafwise`) steps each group of same-shaped leaves as one ``vmap``, so every
group made its own calls: ten groups, ten ``eigh`` calls per update. This module runs every
group's factorizations of one update as **one batched call per kind and level**:

* The numerics ask for a factorization through :func:`eigh` or :func:`qr` (``jnp.linalg``'s
  semantics). Each is a ``jax.jit`` of the ``jnp.linalg`` call under a *marked* name
  (``sketchopt_solver_*``): anywhere else it runs as that call.
* The driver traces each group's step once, to a jaxpr (:func:`run_lockstep`), and evaluates
  all of them together as a dataflow program: every equation whose inputs are known is bound,
  in program order, into the update being traced; a marked call at a jaxpr's top level waits.
  When no group can go on, the waiting calls' operands are stacked into one call per kind,
  dtype and size class (:func:`solve`), their results handed back, and the evaluation resumes.
  A step's independent calls (``kron_fd``'s two range finders, its two sides' sketches) wait
  together; dependent ones (FD's shrink, then the metric's low-rank form) take one level each.
  The number of calls is the number of levels, never of groups; every equation is bound
  exactly once, so nothing is traced or computed twice.
* A marked call inside a nested ``cond``, ``scan`` or ``while`` body (or a custom-derivative
  rule) is not at the top level: it runs there as the direct call. Nested ``jit`` calls are
  inlined, so a marked call inside one is found.

A batch of ``eigh`` operands of different sizes is padded with a diagonal block placed below
the spectrum (Gershgorin: ``-(1 + 2 max_i sum_j |a_ij|)``), so the block-diagonal matrix has the
original eigenpairs exactly, the padded ones first in ascending order, and each result is cut
back; sizes are padded together only while the largest is at most twice the smallest (the
flops of a padded matrix grow with the cube). Reduced QR operands with the same number of
columns are padded with zero rows (exact: a zero row changes no Householder reflector above it);
complete QR operands are batched by shape. A call whose result may go unused (``when``) runs
under a ``lax.cond`` taken only when some operand of its batch is needed.

Results agree with the direct calls to rounding (LAPACK, cuSOLVER and their batched forms may
order their arithmetic differently); eigenvectors are, as always, defined only up to sign.

This module also holds the switch between the backends' code paths (:mod:`sketchopt.backends`).
It sits below the numerics: it imports no other module of the package.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax._src import core as _core
from jax._src import source_info_util as _source_info

__all__ = [
    "ACCELERATOR_ENV",
    "Request",
    "accelerator_path_active",
    "batchable",
    "BATCHING_ENV",
    "batching",
    "batching_active",
    "eigh",
    "forced_accelerator_path",
    "gram_refreshes",
    "gram_refreshes_active",
    "group_level",
    "KERNELS_ENV",
    "kernel_mode",
    "kernels",
    "targets_tpu",
    "tpu_target",
    "qr",
    "run_lockstep",
    "size_classes",
    "solve",
    "trace_key",
]

#: The environment variable that forces the accelerator code path on (``1``) or off (``0``) for
#: the whole process; :func:`sketchopt.accelerator_path` does it for a block of code.
ACCELERATOR_ENV = "SKETCHOPT_ACCELERATOR_PATH"

_FORCED: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "sketchopt_accelerator_path", default=None
)
#: The environment variable that turns the batched factorizations on (``1``) or off (``0``) for
#: a process; :func:`batching` does it for a block of code. Unset: on a GPU or TPU, off on the
#: CPU (:func:`batching_active`).
BATCHING_ENV = "SKETCHOPT_BATCHED_SOLVES"

_BATCHING: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "sketchopt_solver_batching", default=None
)
_GROUP_TRACE: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "sketchopt_solver_group_trace", default=None
)


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value):
    """``var`` set to ``value`` for the code inside it."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def _env_flag(name: str) -> bool | None:
    """The environment variable ``name`` as a flag: ``True``, ``False``, or ``None`` if unset
    or not a flag."""
    value = os.environ.get(name, "").strip().lower()
    return (
        True
        if value in ("1", "true", "yes", "on")
        else (False if value in ("0", "false", "no", "off") else None)
    )


def forced_accelerator_path(enabled: bool | None):
    """The code traced inside it takes the accelerator code path (``enabled``), the CPU one
    (``False``), or the backend's own (``None``)."""
    return _setting(_FORCED, enabled)


def accelerator_path_active() -> bool:
    """Whether the code being traced takes the accelerator code path: the arrowhead eigen-update
    and the Householder null vector of the FD sketches (plain array operations) in place of
    LAPACK's small solves. Forced by :func:`forced_accelerator_path`, else by the environment
    variable :data:`ACCELERATOR_ENV`, else on every backend but the CPU."""
    forced = _FORCED.get()
    if forced is not None:
        return forced
    env = _env_flag(ACCELERATOR_ENV)
    return jax.default_backend() != "cpu" if env is None else env


def batching(enabled: bool | None):
    """Updates traced inside it batch their factorizations across groups (``True``), call them
    group by group (``False``: the per-group program), or follow :data:`BATCHING_ENV` and the
    backend (``None``: :func:`batching_active`)."""
    return _setting(_BATCHING, enabled)


def batching_active() -> bool:
    """Whether updates traced here batch their factorizations: :func:`batching`, else the
    environment variable :data:`BATCHING_ENV`, else on every backend but the CPU.

    On a GPU the batched program is what the accelerators issue asked for and what was measured
    (an NVIDIA H200, 2026-11-28: ``kron_fd``'s update in the transformer benchmark 10.2 ms,
    where 0.9.0's per-group program took 34-39 ms; ``docs/benchmarks/device.md``). On the CPU
    it stays off unless asked for: there jaxlib's batched LAPACK calls run as loops over their
    batch (no fewer library calls, only fewer in the program), and one XLA:CPU hang met while
    building it (LAPACK's ``syevd`` on an operand buffer it shared, fixed by symmetrizing) is
    understood only that far. The switch follows the backend, not
    :func:`accelerator_path_active`: the accelerator path forced on the CPU still runs the CPU's
    library calls."""
    forced = _BATCHING.get()
    if forced is not None:
        return forced
    env = _env_flag(BATCHING_ENV)
    return jax.default_backend() != "cpu" if env is None else env


#: The environment variable that sets the accelerator path's Pallas kernels
#: (:mod:`sketchopt._kernels`) for a process: ``on`` (the default), ``off`` or ``interpret``;
#: :func:`kernels` does it for a block of code.
KERNELS_ENV = "SKETCHOPT_KERNELS"
_KERNEL_MODES = ("on", "off", "interpret")

_KERNELS: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "sketchopt_kernels", default=None
)


def kernels(mode: str | None):
    """Updates traced inside it use the accelerator path's Pallas kernels on a TPU (``"on"``),
    never (``"off"``), through Pallas's interpreter on every backend (``"interpret"``: how the
    tests run them on a CPU), or as :data:`KERNELS_ENV` says (``None``)."""
    if mode not in (None, *_KERNEL_MODES):
        raise ValueError(f"kernels: mode must be one of {_KERNEL_MODES} or None, got {mode!r}")
    return _setting(_KERNELS, mode)


def kernel_mode() -> str:
    """The kernel mode of the code being traced (:func:`kernels`): ``"on"`` unless
    :func:`kernels` or :data:`KERNELS_ENV` says otherwise. The kernels join only the
    accelerator path (:func:`accelerator_path_active`)."""
    if not accelerator_path_active():
        return "off"
    mode = _KERNELS.get()
    if mode is None:
        mode = os.environ.get(KERNELS_ENV, "").strip().lower() or "on"
        if mode not in _KERNEL_MODES:
            raise ValueError(f"{KERNELS_ENV} must be one of {_KERNEL_MODES}, got {mode!r}")
    return mode


_REFRESHES: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "sketchopt_gram_refreshes", default=True
)


def gram_refreshes(enabled: bool):
    """Updates traced inside it keep (``True``, always outside it) or drop (``False``) the FD
    family's exact Gram refresh, a ``lax.cond`` branch taken once every 32 shrinks (numerics
    only). For measurement alone: XLA counts a ``cond`` at its costliest branch, so the
    accelerator benchmark compiles the steps between refreshes without it to amortize the
    branch (``experiments/device_bench.py``). Never for training: the refresh bounds the
    round-off that the tracked Gram matrix accumulates."""
    return _setting(_REFRESHES, bool(enabled))


def gram_refreshes_active() -> bool:
    """Whether the code being traced keeps the exact Gram refresh (:func:`gram_refreshes`)."""
    return _REFRESHES.get()


_TPU_TARGET: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "sketchopt_tpu_target", default=None
)


def tpu_target(enabled: bool | None):
    """Updates traced inside it are traced for a TPU (``True``), for another platform
    (``False``), or for the default backend's (``None``): what a compile ahead of time for a
    TPU on another machine needs (``experiments/aot.py``), as the platform is otherwise known
    only when the program is lowered."""
    return _setting(_TPU_TARGET, enabled)


def targets_tpu() -> bool:
    """Whether the code being traced is for a TPU (:func:`tpu_target`, else the default
    backend): where per-step FD leaves its append to the rotation kernel's pass."""
    forced = _TPU_TARGET.get()
    return jax.default_backend() == "tpu" if forced is None else forced


def trace_key() -> tuple[bool, bool, str, bool, bool]:
    """What decides how an update is traced here: ``(accelerator path, batching, kernels,
    Gram refreshes, TPU target)``. The driver's compiled units key their cache on it."""
    return (
        accelerator_path_active(),
        batching_active(),
        kernel_mode(),
        gram_refreshes_active(),
        targets_tpu(),
    )


def group_level():
    """Marks the current trace level as a group step's top level (the driver enters it where
    it traces the step, inside the group's ``vmap``), for :func:`batchable`."""
    return _setting(_GROUP_TRACE, _core.trace_ctx.trace if batching_active() else None)


def batchable() -> bool:
    """Whether a factorization asked for here joins the update's batched calls: traced at a
    group step's top level (not in a nested ``cond``, ``scan`` or ``vmap`` body) with batching
    on. Numerics that would otherwise avoid a solver call by a ``cond`` ask this."""
    level = _GROUP_TRACE.get()
    return level is not None and _core.trace_ctx.trace is level


# ----------------------------------------------------------------------------------------------
# The marked calls.

_MARK = "sketchopt_solver_"


def _one_at_a_time(factorize: Callable) -> Callable:
    """``factorize`` (one matrix's ``jnp.linalg`` factorization, returning a tuple) such that, on
    the CPU, a batch of matrices -- leading axes, or a ``vmap`` over a group of leaves -- is
    factorized one matrix after the other (``lax.map``) instead of by one batched LAPACK call.

    jaxlib's batched LAPACK kernels split the batch over XLA:CPU's intra-op thread pool and
    block a pool thread until the pieces are done. Two such calls that the program may run at
    the same time (``kron_fd``'s two range finders, two groups' ``eigh``) then held both
    threads of a 2-core machine, each waiting for work queued behind the other: one update of
    the ``networks`` transformer hung in most runs (jaxlib 0.10.2; the pieces were waiting in
    ``ParallelBatchMap``). One matrix at a time never waits on the pool. Other backends keep
    the batched call (cuSOLVER's batched solvers are the point there)."""

    def direct(a):
        if a.ndim > 2:  # explicit leading axes
            flat = a.reshape(-1, *a.shape[-2:])
            out = jax.lax.map(call, flat)
            return tuple(x.reshape(*a.shape[:-2], *x.shape[1:]) for x in out)
        return tuple(factorize(a))

    @jax.custom_batching.custom_vmap
    def call(a):
        return direct(a)

    @call.def_vmap
    def _(axis_size, in_batched, a):
        del axis_size, in_batched  # a's batch axis is its leading one
        out = jax.lax.map(call, a)
        return out, tuple(True for _ in out)

    def run(a):
        return call(a) if jax.default_backend() == "cpu" else tuple(factorize(a))

    return run


_eigh = _one_at_a_time(jnp.linalg.eigh)
_qr_reduced = _one_at_a_time(functools.partial(jnp.linalg.qr, mode="reduced"))
_qr_complete = _one_at_a_time(functools.partial(jnp.linalg.qr, mode="complete"))
_QR = {"reduced": _qr_reduced, "complete": _qr_complete}


def sketchopt_solver_eigh(a):
    return _eigh(a)


def sketchopt_solver_eigh_when(a, when):
    del when  # read by the lockstep evaluation only
    return _eigh(a)


def sketchopt_solver_qr_reduced(a):
    return _qr_reduced(a)


def sketchopt_solver_qr_complete(a):
    return _qr_complete(a)


_MARKED = {
    f.__name__: jax.jit(f)
    for f in (
        sketchopt_solver_eigh,
        sketchopt_solver_eigh_when,
        sketchopt_solver_qr_reduced,
        sketchopt_solver_qr_complete,
    )
}


def eigh(a: jax.Array, *, when: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """``jnp.linalg.eigh(a)``: eigenvalues ascending and eigenvectors of the symmetric (Hermitian)
    ``a``; batched with the update's other calls where the driver runs its groups in lockstep.
    ``when`` (a boolean, false where the result will not be used) lets the batched call be
    skipped when nothing needs it. (``jnp.linalg.eigh`` symmetrizes its operand, which also
    hands LAPACK a buffer of its own: with ``symmetrize_input=False`` an XLA:CPU program
    vmapped over 2048 keys hung in one run of two, ``tests/test_son.py``.)"""
    if not batching_active():
        return _eigh(a)
    if when is None:
        return _MARKED["sketchopt_solver_eigh"](a)
    when = jnp.broadcast_to(jnp.asarray(when, bool), a.shape[:-2])
    return _MARKED["sketchopt_solver_eigh_when"](a, when)


def qr(a: jax.Array, mode: str = "reduced") -> tuple[jax.Array, jax.Array]:
    """``jnp.linalg.qr(a, mode)`` (``"reduced"`` or ``"complete"``), batched with the update's
    other calls where the driver runs its groups in lockstep."""
    if not batching_active():
        return _QR[mode](a)
    return _MARKED[f"sketchopt_solver_qr_{mode}"](a)


# ----------------------------------------------------------------------------------------------
# The lockstep evaluation.


class Request(NamedTuple):
    """A factorization waiting for its batch: its ``kind`` (``("eigh",)`` or ``("qr", mode)``),
    its operand ``a`` (with one leading batch axis) and ``when``, ``None`` or a boolean per
    batch entry saying whether its result is used at all."""

    kind: tuple
    a: jax.Array
    when: jax.Array | None


_KINDS = {
    "sketchopt_solver_eigh": ("eigh",),
    "sketchopt_solver_eigh_when": ("eigh",),
    "sketchopt_solver_qr_reduced": ("qr", "reduced"),
    "sketchopt_solver_qr_complete": ("qr", "complete"),
}


def _is_jit(eqn) -> bool:
    return eqn.primitive.name in ("jit", "pjit") and "jaxpr" in eqn.params


def _marked_kind(eqn) -> tuple | None:
    return _KINDS.get(eqn.params.get("name")) if _is_jit(eqn) else None


def _holds_marks(jaxpr) -> bool:
    return any(
        _marked_kind(e) is not None or (_is_jit(e) and _holds_marks(e.params["jaxpr"].jaxpr))
        for e in jaxpr.eqns
    )


class _Alias(NamedTuple):
    """A step of a flattened program: ``dst = src`` (an inlined ``jit``'s inputs and outputs)."""

    src: tuple
    dst: tuple


def _flattened(jaxpr, consts, env) -> list:
    """The equations of ``jaxpr``, with every nested ``jit`` that holds a marked call inlined
    (its constants written into ``env``)."""
    for v, c in zip(jaxpr.constvars, consts, strict=True):
        env[v] = c
    out = []
    for eqn in jaxpr.eqns:
        if _is_jit(eqn) and _marked_kind(eqn) is None and _holds_marks(eqn.params["jaxpr"].jaxpr):
            inner = eqn.params["jaxpr"]
            out.append(_Alias(tuple(eqn.invars), tuple(inner.jaxpr.invars)))
            out.extend(_flattened(inner.jaxpr, inner.consts, env))
            out.append(_Alias(tuple(inner.jaxpr.outvars), tuple(eqn.outvars)))
        else:
            out.append(eqn)
    return out


class _Program:
    """One group's step as a flattened jaxpr, evaluated as far as its known values allow."""

    def __init__(self, closed, args=()):
        self.env: dict = {}
        self.outvars = closed.jaxpr.outvars
        self.waiting = _flattened(closed.jaxpr, closed.consts, self.env)
        for v, x in zip(closed.jaxpr.invars, args, strict=True):
            self.env[v] = x

    def read(self, v):
        return v.val if isinstance(v, _core.Literal) else self.env[v]

    def known(self, v) -> bool:
        return isinstance(v, _core.Literal) or v in self.env

    def write(self, outvars, values) -> None:
        for v, x in zip(outvars, values, strict=True):
            if not isinstance(v, _core.DropVar):
                self.env[v] = x

    def advance(self) -> list:
        """Bind every equation whose inputs are known, in program order; return the marked
        calls now ready, as ``(equation, operands)`` (their outputs are written later)."""
        ready, later = [], []
        for step in self.waiting:
            inputs = step.src if isinstance(step, _Alias) else step.invars
            if not all(self.known(v) for v in inputs):
                later.append(step)
            elif isinstance(step, _Alias):
                self.write(step.dst, [self.read(v) for v in step.src])
            elif _marked_kind(step) is not None:
                ready.append((step, [self.read(v) for v in step.invars]))
            else:
                self.bind(step)
        self.waiting = later
        return ready

    def bind(self, eqn) -> None:
        """The equation bound into the current trace, as ``jax.core.eval_jaxpr`` binds it."""
        params = eqn.primitive.get_bind_params(eqn.params)
        subfuns = []
        if isinstance(params, tuple):  # JAX before 0.9: (subfuns, params)
            subfuns, params = params
        invals = [self.read(v) for v in eqn.invars]
        with _source_info.user_context(eqn.source_info.traceback), eqn.ctx.manager:
            out = eqn.primitive.bind(*subfuns, *invals, **params)
        self.write(eqn.outvars, out if eqn.primitive.multiple_results else [out])

    def outputs(self) -> list:
        if self.waiting:  # pragma: no cover - every marked call gets its result
            raise RuntimeError("a group step was left waiting for a factorization")
        return [self.read(v) for v in self.outvars]


def run_lockstep(thunks: Sequence[Callable[[], Any]]) -> list[Any]:
    """The results of the zero-argument functions ``thunks`` (the groups' steps), traced once
    each and evaluated together, their top-level factorizations batched (module docstring)."""
    programs, trees = [], []
    for thunk in thunks:
        closed, shapes = jax.make_jaxpr(thunk, return_shape=True)()
        programs.append(_Program(closed))
        trees.append(jax.tree.structure(shapes))
    while True:
        waiting = [(p, eqn, operands) for p in programs for eqn, operands in p.advance()]
        if not waiting:
            break
        requests, shapes = [], []
        for _, eqn, operands in waiting:
            a = operands[0]
            lead, mat = a.shape[:-2], a.shape[-2:]
            when = operands[1].reshape(math.prod(lead)) if len(operands) > 1 else None
            batch = math.prod(lead)  # (explicit: a 0 x 0 matrix has no -1 to infer)
            requests.append(Request(_marked_kind(eqn), a.reshape(batch, *mat), when))
            shapes.append(lead)
        for (program, eqn, _), lead, result in zip(waiting, shapes, solve(requests), strict=True):
            program.write(eqn.outvars, [r.reshape(*lead, *r.shape[1:]) for r in result])
    return [tree.unflatten(p.outputs()) for p, tree in zip(programs, trees, strict=True)]


# ----------------------------------------------------------------------------------------------
# One batched call per kind and size class.


def size_classes(sizes: Sequence[int]) -> list[list[int]]:
    """Indices of ``sizes`` grouped so that within a class the largest is at most twice the
    smallest (identical sizes always together)."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    classes: list[list[int]] = []
    for i in order:
        if classes and sizes[i] <= 2 * sizes[classes[-1][0]]:
            classes[-1].append(i)
        else:
            classes.append([i])
    return classes


def _padded_eigh(mats: Sequence[jax.Array]) -> list[tuple[jax.Array, jax.Array]]:
    """``eigh`` of each ``(b, n_i, n_i)`` stack in ``mats``, as one call on their concatenation,
    each padded to the largest ``n`` by a diagonal block below its spectrum."""
    width = max(a.shape[-1] for a in mats)
    stacked = []
    for a in mats:
        n = a.shape[-1]
        if n < width:
            radius = jnp.max(jnp.sum(jnp.abs(a), axis=-1), axis=-1)  # Gershgorin: |lam| <= radius
            floor = -(1 + 2 * radius)
            tail = (jnp.arange(width) >= n).astype(floor.dtype)
            a = jnp.pad(a, ((0, 0), (0, width - n), (0, width - n)))
            a = a + (floor[:, None] * tail)[..., None] * jnp.eye(width, dtype=a.dtype)
        stacked.append(a)
    w, v = _eigh(jnp.concatenate(stacked))
    out, start = [], 0
    for a in mats:
        b, n = a.shape[0], a.shape[-1]
        cut = width - n  # the padded eigenvalues come first (ascending)
        out.append((w[start : start + b, cut:], v[start : start + b, :n, cut:]))
        start += b
    return out


def _batched_qr(mats: Sequence[jax.Array], mode: str) -> list[tuple[jax.Array, jax.Array]]:
    """QR of each ``(b, m_i, n)`` stack in ``mats`` as one call on their concatenation. In
    reduced mode the rows are zero-padded to the longest: a zero row changes no Householder
    reflector of the columns above it, so ``Q`` is the matrix's own with zero rows below
    (complete mode takes one shape only)."""
    rows = max(a.shape[-2] for a in mats)
    stacked = [jnp.pad(a, ((0, 0), (0, rows - a.shape[-2]), (0, 0))) for a in mats]
    q, r = _QR[mode](jnp.concatenate(stacked))
    out, start = [], 0
    for a in mats:
        b = a.shape[0]
        out.append((q[start : start + b, : a.shape[-2]], r[start : start + b]))
        start += b
    return out


def _unused(kind, mats):
    """Zeros shaped like the results of ``kind`` on ``mats`` (a batch nobody needs)."""
    out = []
    for a in mats:
        if kind[0] == "eigh":
            w = jnp.zeros(a.shape[:-1], jnp.finfo(a.dtype).dtype)
            out.append((w, jnp.zeros_like(a)))
        else:
            m, n = a.shape[-2:]
            k = m if kind[1] == "complete" else min(m, n)
            shape = a.shape[:-2]
            out.append((jnp.zeros((*shape, m, k), a.dtype), jnp.zeros((*shape, k, n), a.dtype)))
    return out


def _when_any(requests: Sequence[Request]) -> jax.Array | None:
    """Whether any of ``requests`` is needed (``None``: some always is)."""
    if any(r.when is None for r in requests):
        return None
    return jnp.any(jnp.concatenate([r.when for r in requests]))


def solve(requests: Sequence[Request]) -> list[tuple[jax.Array, jax.Array]]:
    """The results of ``requests`` (each operand with one leading batch axis), in order: one
    batched call per kind, dtype and size class (module docstring), each under a ``lax.cond``
    when no request in it is needed unconditionally."""
    results: list[Any] = [None] * len(requests)
    buckets: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        # eigh: size classes below; reduced QR: one call per column count (rows padded);
        # complete QR: one call per shape
        shape = {"eigh": (), "reduced": r.a.shape[-1:]}.get(r.kind[-1], r.a.shape[1:])
        key = (r.kind, jnp.dtype(r.a.dtype).name, *shape)
        buckets.setdefault(key, []).append(i)
    for key, members in buckets.items():
        kind = key[0]
        classes = (
            size_classes([requests[i].a.shape[-1] for i in members])
            if kind[0] == "eigh"
            else [list(range(len(members)))]
        )
        for cls in classes:
            chosen = [members[c] for c in cls]
            mats = [requests[i].a for i in chosen]
            if kind[0] == "eigh":
                run = functools.partial(_padded_eigh, mats)
            else:
                run = functools.partial(_batched_qr, mats, kind[1])
            needed = _when_any([requests[i] for i in chosen])
            if needed is None:
                out = run()
            else:
                out = jax.lax.cond(needed, run, functools.partial(_unused, kind, mats))
            for i, result in zip(chosen, out, strict=True):
                results[i] = result
    return results
