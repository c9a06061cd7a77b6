"""The small factorizations batched across the driver's groups (``sketchopt._solvers``) and the
switch to the accelerator code path (``sketchopt.backends``).

A batched update must compute what the per-group calls computed (to rounding: compared in
float64 through the updates, never through eigenvectors, which are defined up to sign), and its
compiled program must hold one solver call per kind and level of dependence, whatever the number
of shape groups: the issue's proxy, counted in the optimized program here on a small tree.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sketchopt as so
from sketchopt import _solvers

#: Custom-call targets of the dense solvers, as ``experiments/device_bench.py`` counts them.
SOLVER = re.compile(r"(syev|heev|geqrf|orgqr|ungqr|householder_product|potrf|gesvd|getrf)", re.I)

# Four shape groups of leaves above the driver's small-leaf width (``SMALL_LEAF``), one of two
# leaves, and two small leaves, which the paddable rules step as one more group.
TREE = {
    "w1": jnp.zeros((70, 64)),
    "w2": jnp.zeros((70, 64)),
    "w3": jnp.zeros((4200,)),
    "e": jnp.zeros((65, 66)),
    "b1": jnp.zeros((9,)),
    "b2": jnp.zeros((3,)),
}


def _solver_calls(compiled) -> dict[str, int]:
    calls: dict[str, int] = {}
    for target in re.findall(r'custom_call_target="([^"]+)"', compiled.as_text()):
        if SOLVER.search(target):
            calls[target] = calls.get(target, 0) + 1
    return calls


def _gradients(params, steps, seed=0):
    key = jax.random.PRNGKey(seed)
    out = []
    for _ in range(steps):
        key, sub = jax.random.split(key)
        keys = jax.random.split(sub, len(params))
        out.append(
            {
                name: jax.random.normal(k, p.shape, p.dtype) * (1 + i)
                for i, ((name, p), k) in enumerate(zip(sorted(params.items()), keys, strict=True))
            }
        )
    return out


def _run(tx, params, grads):
    """The updates over ``grads``, the final state and the solver calls of the compiled step."""
    state, updates = tx.init(params), []
    step = jax.jit(tx.update).lower(grads[0], state, params).compile()
    for g in grads:
        u, state = step(g, state, params)
        updates.append(u)
    return updates, state, _solver_calls(step)


# One learner per distinct batched code path: the FD sketch under both rules, the SON sketches
# (FD and Oja: QR levels), kron_fd. The robust variants and the other aliases step the same
# factorizations.
LEARNERS = {
    "ada_fd": lambda: so.ada_fd(0.1, 4, 0.5, robust=False),
    "ada_fd_dual_averaging": lambda: so.ada_fd_dual_averaging(0.1, 4, 0.5, robust=False),
    "fd_son": lambda: so.fd_son(1.0, 4),
    "oja_son": lambda: so.oja_son(1.0, 4),
    "kron_fd": lambda: so.kron_fd(
        1e-2, 4, graft=None, compress="range", momentum=None, update_every=1, refresh_every=1
    ),
}


# Every learner on the CPU path; on the accelerator path (whose per-group program compiles an
# arrowhead solve per group, the slow part of this module) the FD family and kron_fd.
CASES = [(name, False) for name in sorted(LEARNERS)] + [
    (name, True) for name in ("ada_fd", "kron_fd")
]


@pytest.mark.parametrize("name, accelerator", CASES)
def test_batched_updates_equal_the_per_group_calls_in_float64(name, accelerator):
    """The batched step computes the per-group step's updates, and its compiled program holds at
    most three solver calls for the four shape groups (the issue's budget: the FD family's two
    ``eigh`` levels; ``kron_fd``'s QR, factor and form, and one ``eigh``), fewer than the
    per-group program, which has them once per group."""
    with jax.enable_x64(True), so.accelerator_path(accelerator):
        params = jax.tree.map(lambda p: p.astype(jnp.float64), TREE)
        grads = _gradients(params, 6)
        with _solvers.batching(True):
            batched, state, batched_calls = _run(LEARNERS[name](), params, grads)
        with _solvers.batching(False):
            direct, _, direct_calls = _run(LEARNERS[name](), params, grads)
        assert int(so.diagnostics(state)["skipped_updates"]) == 0
    for b, d in zip(batched, direct, strict=True):
        for key in b:
            np.testing.assert_allclose(b[key], d[key], rtol=1e-9, atol=1e-12, err_msg=key)
    assert sum(batched_calls.values()) <= 3, batched_calls
    if sum(direct_calls.values()):  # the accelerator path's FD family solves without LAPACK
        assert sum(direct_calls.values()) > sum(batched_calls.values()), direct_calls


def test_padded_eigh_keeps_each_spectrum():
    """Matrices of sizes 3, 4 and 5 in one call: each padded by a block below its spectrum, each
    result the matrix's own eigendecomposition (checked through ``V diag(w) V^T``)."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        mats = []
        for n, b in ((3, 2), (4, 1), (5, 3)):
            a = rng.normal(size=(b, n, n))
            mats.append(jnp.asarray(a + np.swapaxes(a, -1, -2)))  # symmetric, indefinite
        results = _solvers.solve([_solvers.Request(("eigh",), a, None) for a in mats])
        for a, (w, v) in zip(mats, results, strict=True):
            assert w.shape == a.shape[:-1] and v.shape == a.shape
            np.testing.assert_allclose(w, np.linalg.eigvalsh(np.asarray(a)), atol=1e-12)
            back = jnp.einsum("bij,bj,bkj->bik", v, w, v)
            np.testing.assert_allclose(back, a, atol=1e-12)


def test_a_batch_nobody_needs_is_skipped():
    """``when`` false for every request: the batched call sits under a ``cond`` not taken (the
    results are zeros); one request needed runs the whole batch."""
    a = jnp.stack([jnp.diag(jnp.arange(1.0, 4.0))] * 2)
    (w, v), _ = _solvers.solve(
        [
            _solvers.Request(("eigh",), a, jnp.array([False, False])),
            _solvers.Request(("eigh",), a * 2, jnp.array([False, False])),
        ]
    )
    np.testing.assert_array_equal(w, 0)
    np.testing.assert_array_equal(v, 0)
    ((w, _),) = _solvers.solve([_solvers.Request(("eigh",), a, jnp.array([False, True]))])
    np.testing.assert_allclose(w, [[1.0, 2.0, 3.0]] * 2)


def test_sizes_pad_together_only_within_a_factor_of_two():
    assert _solvers.size_classes([11, 11, 20, 64, 33, 8]) == [[5, 0, 1], [2, 4], [3]]


def test_reduced_qr_of_different_lengths_is_one_padded_call():
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        mats = [jnp.asarray(rng.normal(size=(2, m, 3))) for m in (4, 9)]
        results = _solvers.solve([_solvers.Request(("qr", "reduced"), a, None) for a in mats])
        for a, (q, r) in zip(mats, results, strict=True):
            assert q.shape == a.shape and r.shape == (2, 3, 3)
            np.testing.assert_allclose(q @ r, a, atol=1e-12)
            np.testing.assert_allclose(
                jnp.swapaxes(q, -1, -2) @ q, np.stack([np.eye(3)] * 2), atol=1e-12
            )


def test_lockstep_batches_independent_calls_and_keeps_dependent_ones_in_order():
    """Two programs, each with two independent ``eigh`` calls and a third that depends on them:
    two levels, so two batched calls, and the results of the direct calls."""
    rng = np.random.default_rng(2)
    mats = [jnp.asarray(rng.normal(size=(4, 4)), jnp.float32) for _ in range(4)]
    mats = [m + m.T for m in mats]

    def program(a, b):
        wa, va = _solvers.eigh(a)
        wb, _ = _solvers.eigh(b)
        c = va @ jnp.diag(wa + wb) @ va.T
        return _solvers.eigh(c)[0]

    def both():
        return _solvers.run_lockstep(
            [lambda: program(mats[0], mats[1]), lambda: program(mats[2], mats[3])]
        )

    with _solvers.batching(True):
        text = jax.jit(both).lower().compile().as_text()
        got = jax.jit(both)()
    targets = re.findall(r'custom_call_target="([^"]+)"', text)
    assert sum(1 for t in targets if SOLVER.search(t)) == 2, targets
    for g, (a, b) in zip(got, [mats[:2], mats[2:]], strict=True):
        np.testing.assert_allclose(g, jax.jit(program)(a, b), rtol=1e-4, atol=1e-5)


def test_calls_in_nested_control_flow_run_where_they_are():
    """A marked call inside a ``cond`` body is not at the top level of the program: it runs
    there as the direct call; outside the driver every call is the direct one."""
    a = jnp.eye(3) * jnp.arange(1.0, 4.0)

    def program():
        return jax.lax.cond(True, lambda x: _solvers.eigh(x)[0], lambda x: x[0], a)

    with _solvers.batching(True):
        (inner,) = _solvers.run_lockstep([program])
    np.testing.assert_allclose(inner, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(_solvers.eigh(a)[0], [1.0, 2.0, 3.0])
    assert not _solvers.batchable()


def test_batching_follows_the_backend_unless_asked(monkeypatch):
    monkeypatch.delenv(_solvers.BATCHING_ENV, raising=False)
    assert _solvers.batching_active() == (jax.default_backend() != "cpu")
    with monkeypatch.context() as m:  # what a GPU or TPU process sees
        m.setattr(jax, "default_backend", lambda: "gpu")
        assert _solvers.batching_active()
        with so.accelerator_path(False):  # the path does not decide it
            assert _solvers.batching_active()
        m.setenv(_solvers.BATCHING_ENV, "0")
        assert not _solvers.batching_active()
    with monkeypatch.context() as m:
        m.setattr(jax, "default_backend", lambda: "cpu")
        assert not _solvers.batching_active()
        with so.accelerator_path():
            assert not _solvers.batching_active()
    monkeypatch.setenv(_solvers.BATCHING_ENV, "1")
    assert _solvers.batching_active()
    with _solvers.batching(False):
        assert not _solvers.batching_active()
        assert _solvers.trace_key()[1] is False


def test_the_switch_selects_the_path_and_keys_the_compiled_units(monkeypatch):
    monkeypatch.delenv(_solvers.ACCELERATOR_ENV, raising=False)
    # the backend's own path: the CPU's here, the accelerator's where the suite runs on one
    assert so.uses_accelerator_path() == (jax.default_backend() != "cpu")
    with so.accelerator_path():
        assert so.uses_accelerator_path()
        with so.accelerator_path(False):
            assert not so.uses_accelerator_path()
    monkeypatch.setenv(_solvers.ACCELERATOR_ENV, "1")
    assert so.uses_accelerator_path()
    with so.accelerator_path(None):
        assert so.uses_accelerator_path()
    monkeypatch.setenv(_solvers.ACCELERATOR_ENV, "0")
    assert not so.uses_accelerator_path()
    monkeypatch.delenv(_solvers.ACCELERATOR_ENV)

    # An eager transform compiles once per path and then reuses it: the arrowhead path has no
    # LAPACK call, so its counters tell the two programs apart only through the same results.
    tx = so.ada_fd(0.1, 3, 0.5, robust=False)
    params = {"w": jnp.zeros(7)}
    grads = _gradients(params, 5)
    outs = []
    for accelerator in (False, True, False):
        state = tx.init(params)
        with so.accelerator_path(accelerator):
            for g in grads:
                u, state = tx.update(g, state, params)
        outs.append(u["w"])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(outs[0], outs[2])


def test_on_the_cpu_a_batch_is_factorized_one_matrix_at_a_time():
    """jaxlib's batched LAPACK kernels wait on XLA:CPU's thread pool for their pieces; two of
    them running at once held both threads of a 2-core machine (``kron_fd``'s two range finders
    under a group's ``vmap`` hung the ``networks`` transformer's update in most runs). On the
    CPU every factorization, vmapped or with leading axes, direct or batched across groups,
    is one LAPACK call per matrix: no solver custom call of the program has a batch axis, and
    the results are the batched call's."""
    a = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 6, 5))
    sym = jnp.einsum("...ij,...kj->...ik", a, a)
    for batched in (False, True):
        with _solvers.batching(batched):

            def f(s, x):
                w, v = jax.vmap(_solvers.eigh)(s)
                q, r = _solvers.qr(x)
                return w, v, q, r

            compiled = jax.jit(f).lower(sym, a).compile().as_text()
            calls = [line for line in compiled.splitlines() if "custom-call(" in line]
            calls = [line for line in calls if SOLVER.search(line)]
            assert calls
            for line in calls:  # every operand and result of a solver call is one matrix
                shapes = re.findall(r"f32\[([\d,]*)\]", line)
                assert all(s.count(",") <= 1 for s in shapes), line
            w, v, q, r = jax.jit(f)(sym, a)
            ref_w, ref_v = jnp.linalg.eigh(sym)
            np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(
                v * w[..., None, :] @ jnp.swapaxes(v, -1, -2), sym, atol=1e-3
            )
            np.testing.assert_allclose(q @ r, a, atol=1e-5)
