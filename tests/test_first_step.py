"""The counters of ``experiments/first_step.py`` (where a first step's compile time goes): the
learner names it parses, the equations it counts and charges, the kernels it reads from an
optimized HLO module. The timings themselves are benchmark output (docs/benchmarks/speed.md)."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import optax
import pytest
from experiment_support import REPO  # noqa: F401  (puts the repository on sys.path)

import sketchopt
from experiments import first_step as fs


def test_learner_names_and_their_options():
    assert isinstance(fs.transform("adam"), optax.GradientTransformation)
    default = fs.transform("kron_fd")
    plain = fs.transform("kron_fd:graft=None,block_size=8,momentum=None")
    params = {"w": jnp.ones((3, 2))}
    grads = {"w": jnp.array([[4.0, 0], [0, 0], [0, 0]])}
    # Shampoo's own step is not grafted: its entry is 1 (docstring of kron_fd), the default's not
    u_plain, _ = plain.update(grads, plain.init(params), params)
    u_default, _ = default.update(grads, default.init(params), params)
    assert float(u_plain["w"][0, 0]) == pytest.approx(-1e-2 * (16 + 1e-6) ** -0.5 * 4, rel=1e-4)
    assert float(u_default["w"][0, 0]) != pytest.approx(float(u_plain["w"][0, 0]), rel=1e-2)
    with pytest.raises(ValueError, match="unknown learner"):
        fs.transform("sgd")


def test_equations_are_counted_with_nested_ones_and_charged_to_sketchopt():
    def f(x):
        return jax.jit(lambda y: jnp.sin(y) * 2)(x) + 1

    jaxpr = jax.make_jaxpr(f)(1.0)
    assert fs.count_eqns(jaxpr) == len(jaxpr.eqns) + len(jaxpr.eqns[0].params["jaxpr"].eqns)
    tx = sketchopt.ada_diag(1.0)
    params = {"w": jnp.ones(3)}
    owners: collections.Counter = collections.Counter()
    total = fs.count_eqns(jax.make_jaxpr(tx.update)(params, tx.init(params), params), owners)
    assert sum(owners.values()) == total
    assert any(name.startswith("_leafwise.") for name in owners), owners


def test_kernels_of_an_optimized_module_are_charged_to_their_functions():
    tx = sketchopt.ada_diag(1.0)
    params = {"w": jnp.ones(3), "b": jnp.ones((2, 2))}
    hlo = jax.jit(tx.update).lower(params, tx.init(params), params).compile().as_text()
    owners = fs.fusion_owners(hlo)
    kernels = sum(" = " in line and " fusion(" in line for line in hlo.splitlines())
    assert kernels and sum(owners.values()) >= kernels
    assert any(name.startswith(("_leafwise.", "metrics.", "operators.")) for name in owners), owners
    assert fs.instructions(hlo) >= kernels
