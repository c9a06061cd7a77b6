"""``sketchopt.diagnostics``: the counters a user watches, read from any state that holds
sketchopt's (alone, chained, injected, under ``jit``)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sketchopt as so


def _run(tx, grads, params):
    state = tx.init(params)
    for g in grads:
        _, state = tx.update(g, state, params)
    return state


def test_skipped_updates_and_steps_through_optax_wrappers():
    params = {"w": jnp.zeros(4), "b": jnp.zeros(())}
    good = {"w": jnp.arange(4.0), "b": jnp.ones(())}
    bad = {"w": jnp.array([1.0, jnp.inf, 0.0, 0.0]), "b": jnp.array(jnp.nan)}
    tx = optax.chain(
        optax.clip_by_global_norm(10.0),
        so.inject_hyperparams(so.ada_fd)(learning_rate=0.1),
    )
    state = _run(tx, [good, bad, good, bad, bad], params)
    d = jax.jit(so.diagnostics)(state)
    assert int(d["steps"]) == 5
    # the clip turns every entry of a gradient with an inf or NaN into NaN: 2 leaves x 3 steps
    assert int(d["skipped_updates"]) == 6
    assert int(d["rejected_rows"]) == 0


def test_sketch_mass_and_ridge_follow_the_rfd_sketch():
    """Until the sketch shrinks it holds every gradient exactly and has no ridge; then each shrink
    takes ``delta`` from each of the ``m`` squared singular values and RFD's ridge grows by
    ``delta / 2`` (RFD paper Alg. 2): ``sketch_mass + 2 m ridge`` is the gradients' total squared
    norm."""
    rng = np.random.default_rng(0)
    grads = [jnp.asarray(rng.standard_normal(6), jnp.float32) for _ in range(8)]
    total = sum(float(jnp.sum(g**2)) for g in grads)
    params = jnp.zeros(6)
    exact = so.diagnostics(_run(so.ada_fd(0.1, sketch_size=10), grads, params))
    np.testing.assert_allclose(float(exact["sketch_mass"]), total, rtol=1e-5)
    assert float(exact["ridge"]) == 0.0
    shrunk = so.diagnostics(_run(so.ada_fd(0.1, sketch_size=3), grads, params))
    assert float(shrunk["ridge"]) > 0
    np.testing.assert_allclose(
        float(shrunk["sketch_mass"]) + 2 * 3 * float(shrunk["ridge"]), total, rtol=1e-4
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: so.kron_fd(1e-3, sketch_size=2),
        lambda: so.fd_son(),
        lambda: so.ada_diag(0.1),
        lambda: so.ftrl_proximal(0.1, 1.0, 0.0, 0.0),
    ],
    ids=["kron_fd", "fd_son", "ada_diag", "ftrl_proximal"],
)
def test_every_family_reports_its_steps(make):
    params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)}
    grads = [jax.tree.map(lambda p, i=i: jnp.full(p.shape, i + 1.0), params) for i in range(3)]
    d = so.diagnostics(_run(make(), grads, params))
    assert int(d["steps"]) == 3 and int(d["skipped_updates"]) == 0
    assert set(d) == {"steps", "skipped_updates", "rejected_rows", "eigh_fallbacks",
                      "sketch_mass", "ridge"}  # fmt: skip


@pytest.mark.parametrize(
    "state",
    [
        optax.adam(1e-3).init({"w": jnp.zeros(3)}),
        optax.chain(optax.clip(1.0), optax.sgd(0.1)).init({"w": jnp.zeros(3)}),
        {"w": jnp.zeros(3)},
        (),
    ],
    ids=["adam", "optax_chain", "a_tree", "empty"],
)
def test_a_state_without_sketchopt_is_refused(state):
    with pytest.raises(ValueError, match="holds no state of a sketchopt transform"):
        so.diagnostics(state)


def test_one_sketchopt_transform_among_optax_ones_is_read():
    params = {"w": jnp.zeros(3)}
    tx = optax.chain(optax.clip_by_global_norm(1.0), so.ada_fd(0.1), optax.scale(-1.0))
    state = _run(tx, [{"w": jnp.array([1.0, jnp.nan, 0.0])}, {"w": jnp.array([0.6, 0.8, 0.0])}],
                 params)  # fmt: skip
    d = jax.jit(so.diagnostics)(state)
    assert int(d["steps"]) == 2 and int(d["skipped_updates"]) == 1
    np.testing.assert_allclose(float(d["sketch_mass"]), 1.0, rtol=1e-5)
