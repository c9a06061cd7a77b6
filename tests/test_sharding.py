"""Sharded optimizer states (``sketchopt.sharding``) on 8 simulated CPU devices.

The 8-device checks run in a subprocess (``--xla_force_host_platform_device_count=8`` must be set
before JAX initializes, and must not leak into the rest of the suite). On a ``(data=2, model=4)``
mesh, with parameters sharded along their leading axis over ``model``, every transform runs under
``jax.jit`` with the state laid out by :func:`sketchopt.sharding.state_sharding`, on an
``AxisType.Explicit`` mesh (and, for one family of each kind of state, an ``AxisType.Auto``
one), and

* its parameters after a few steps equal a single-device run within float32 tolerance;
* every state array has the sharding that was asked for, the ``sketch_size x d`` arrays
  ``P(None, "model")``;
* the compiled step holds no all-gather of a sketch-sized array (only the ``d x d`` baselines
  gather: ADA-FULL and ADA-LR for their dense decompositions, ONS to symmetrize its inverse;
  RADAGRAD gathers ``d``-vectors for its DCT, never its sketch).

The families whose update factorizes run a second subprocess with the batched factorizations on
(the default on a GPU or TPU; the first run keeps the per-group program).

Also in the subprocess: an orbax save/restore straight into the sharded layout
(``sharding.abstract_state``) and ``sharding.constrain`` inside a step. The layout rules
themselves are unit-tested in-process on a one-device mesh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import sketchopt as so
from sketchopt import sharding

# name -> (factory source, which all-gathers are acceptable: "none", "vectors", "any").
# Every family goes through one driver (sketchopt._leafwise), so the 8-device run keeps one
# representative of each distinct sharded code path rather than every alias: the FD sketch under
# both rules (mirror descent with an l1 prox, dual averaging with the l1-ball's solver), the RFD
# sketch's fast path, the Oja and random-projection sketches (through SON, which also covers
# their Ada-FD metric's sketch update), the diagonal and dense metrics, RADAGRAD's DCT, ADA-LR's
# dense projection, ONS, and the elementwise first-order learners (FTRL; RDA and FOBOS share its
# driver path and elementwise state). s_adagrad, rfd_son and the plain aliases add no sharded
# code of their own.
FAMILIES = {
    "ada_fd": ("so.ada_fd(0.1, 4, 0.1)", "none"),
    "ada_fd_robust_fast": ("so.ada_fd(0.1, 4, 0.1, robust=True, fast=True)", "none"),
    # the regularized prox may gather d-vectors (and k x k matrices), never the sketch
    "ada_fd_l1": ("so.ada_fd(0.1, 4, 0.1, regularizer=regularizers.l1(1e-2))", "vectors"),
    "ada_fd_da_l1_ball": (
        "so.ada_fd_dual_averaging(0.1, 4, 0.1, regularizer=regularizers.l1_ball(5.0))",
        "vectors",
    ),
    "ada_diag": ("so.ada_diag(0.1, 0.1)", "none"),
    "ada_full": ("so.ada_full(0.1, 0.1)", "any"),
    "fd_son": ("so.fd_son(1.0, 4)", "none"),
    "oja_son": ("so.oja_son(1.0, 4)", "none"),
    "rp_son": ("so.rp_son(1.0, 4, KEY)", "none"),
    # ONS symmetrizes its d x d inverse every step (a transpose moves the whole matrix)
    "ons": ("so.ons(1.0)", "any"),
    "radagrad": ("so.radagrad(0.1, 4, 0.1, KEY)", "vectors"),
    "ada_lr": ("so.ada_lr(0.1, 4, 0.1, KEY)", "any"),
    "ftrl_proximal": ("so.ftrl_proximal(0.1, 1.0, 1e-2, 1e-2)", "none"),
    # the factored metric keeps its two sketches replicated for now (it gathers each leaf's
    # gradient); tested for equality with one device only
    # the Kronecker-factored sketches: w (32 x 8, rows split) has its left sketch split along
    # its rows, its right one replicated; the right stream is range-compressed across devices
    "kron_fd": (
        "so.kron_fd(0.1, 4, delta=0.1, refresh_every=2, graft='adam', refresh_tolerance=1e-3)",
        "none",
    ),
}
MODES = ["auto", "explicit"]
# Explicit mode (sharding in types: plain init lays the state out) runs for every family; Auto
# mode (GSPMD propagation from sharding.init) for one family of each kind of state: a sketch
# under each rule, the SON sketch, RADAGRAD's DCT and the elementwise learners. The other
# families' Auto-mode programs differ from these only in the arithmetic on the same layouts.
AUTO = {"ada_fd", "ada_fd_da_l1_ball", "fd_son", "radagrad", "ftrl_proximal"}
# Parameters after 3 steps, sharded vs single device (float32; the updates are O(0.1)).
TOLERANCE = 1e-4
# RADAGRAD's step uses Sigma^{1/2} of G~ (fourth roots of the Gram eigenvalues), which amplifies
# the float32 round-off of near-zero eigenvalues (the sharded DCT sums in another order).
LOOSER = {"radagrad": 1e-3}

SCRIPT = textwrap.dedent(
    r"""
    import json, re, sys, traceback
    import jax, jax.numpy as jnp, numpy as np, optax
    import sketchopt as so
    from sketchopt import metrics, regularizers, sketches, sharding
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    assert jax.device_count() == 8, jax.devices()
    KEY = jax.random.PRNGKey(3)
    FAMILIES = json.loads(sys.argv[1])
    STEPS = 3
    GATHER = re.compile(r"= (\w+)\[([\d,]*)\][^ ]* (all-gather|all-to-all)\(")

    params0 = {
        "w": jax.random.normal(jax.random.PRNGKey(0), (32, 8)),  # d = 256, sharded rows
        "b": jnp.linspace(-1.0, 1.0, 16),  # d = 16
        "s": jnp.asarray(0.5),  # replicated
    }
    specs = {"w": P("model", None), "b": P("model"), "s": P()}

    def grads(p, i):
        return jax.tree.map(lambda x: jnp.cos(x * (i + 1.0)) + 0.1, p)

    def run(tx, update, params, state):
        for i in range(STEPS):
            updates, state = update(grads(params, i), state, params)
            params = optax.apply_updates(params, updates)
        return params, state

    def gathers(text):
        return sorted({f"{m.group(3)} {m.group(1)}[{m.group(2)}]" for m in GATHER.finditer(text)})

    def spec_of(x):
        spec = getattr(x.sharding, "spec", None)
        return None if spec is None else [list(e) if isinstance(e, tuple) else e for e in spec]

    results = {}
    for name, (source, modes) in FAMILIES.items():
        tx = eval(source)
        ref, _ = run(tx, jax.jit(tx.update), params0, tx.init(params0))
        for mode in modes:
            kind = AxisType.Explicit if mode == "explicit" else AxisType.Auto
            mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))
            shard = {k: NamedSharding(mesh, v) for k, v in specs.items()}
            out = results.setdefault(name, {})[mode] = {}
            try:
                with jax.set_mesh(mesh):
                    params = jax.device_put(params0, shard)
                    state = sharding.init(tx, params)
                    wanted = sharding.state_sharding(state, params)
                    if mode == "explicit":  # plain init reads the layout off the parameters
                        plain = tx.init(params)
                        out["plain_init_ok"] = all(
                            x.sharding.is_equivalent_to(s, x.ndim)
                            for x, s in zip(
                                jax.tree.leaves(plain), jax.tree.leaves(wanted), strict=True
                            )
                        )
                    step = jax.jit(tx.update, out_shardings=(shard, wanted))
                    compiled = step.lower(grads(params, 0), state, params).compile()
                    got, state = run(tx, compiled, params, state)
                leaves = jax.tree.leaves(state)
                out["sharding_ok"] = all(
                    x.sharding.is_equivalent_to(s, x.ndim)
                    for x, s in zip(leaves, jax.tree.leaves(wanted), strict=True)
                )
                out["sketch_specs"] = sorted(
                    {str(spec_of(x)) for x in leaves if x.ndim == 2 and x.shape[-1] == 256}
                )
                out["factor_specs"] = {  # (4, 32) and (4, 8): kron_fd's two sides of w
                    side: sorted({str(spec_of(x)) for x in leaves if x.shape == (4, size)})
                    for side, size in (("left", 32), ("right", 8))
                }
                out["param_specs"] = {k: spec_of(v) for k, v in got.items()}
                out["diff"] = max(
                    float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0))
                    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True)
                )
                out["gathers"] = gathers(compiled.as_text())
            except Exception as err:  # reported per family and mode
                out["error"] = f"{type(err).__name__}: {err}"[:600]
                out["where"] = [
                    f"{f.filename.split('/')[-1]}:{f.lineno}"
                    for f in traceback.extract_tb(err.__traceback__)
                    if "sketchopt" in f.filename
                ][-4:]

    # orbax: save the sharded state and restore it straight into its sharded layout; and
    # sharding.constrain inside a step with no out_shardings.
    extras = {}
    try:
        import orbax.checkpoint as ocp
        mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
        shard = {k: NamedSharding(mesh, v) for k, v in specs.items()}
        params = jax.device_put(params0, shard)
        tx = so.ada_fd(0.1, 4, 0.1)
        state = sharding.init(tx, params)
        state = jax.jit(tx.update)(grads(params, 0), state, params)[1]
        path = sys.argv[2]
        with ocp.StandardCheckpointer() as ckpt:
            ckpt.save(path, state)
            ckpt.wait_until_finished()
        target = sharding.abstract_state(tx, params)
        with ocp.StandardCheckpointer() as ckpt:
            restored = ckpt.restore(path, target)
        extras["orbax_equal"] = all(
            np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True)
        )
        extras["orbax_sharding_ok"] = all(
            x.sharding.is_equivalent_to(t.sharding, x.ndim)
            for x, t in zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True)
        )
        extras["orbax_rows_spec"] = spec_of(restored.metric_state.rows.groups[-1])

        def constrained_step(g, st, p):
            updates, st = tx.update(g, st, p)
            return updates, sharding.constrain(st, shard, p)

        replicated = jax.device_put(tx.init(params0), NamedSharding(mesh, P()))
        _, st2 = jax.jit(constrained_step)(grads(params, 0), replicated, params)
        extras["constrain_rows_spec"] = spec_of(st2.metric_state.rows.groups[-1])
    except Exception as err:
        extras["error"] = f"{type(err).__name__}: {err}"[:600]

    # A parameter split along a non-leading axis of an explicit mesh (and one split along two
    # axes): init and update, eager and jitted, keep one sharding type; the flattened sketch
    # stays split; three steps match one device.
    cross = {}
    for name, source in (
        ("ada_fd", "so.ada_fd(0.1, 4, 0.1)"),
        ("ada_diag_dual_averaging", "so.ada_diag_dual_averaging(0.1, 0.1)"),
        ("fd_son", "so.fd_son(1.0, 4)"),
    ):
        tx = eval(source)
        mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
        for label, spec in (("cols", P(None, "model")), ("both", P("data", "model"))):
            p0 = {"v": jax.random.normal(jax.random.PRNGKey(1), (8, 32))}
            ref, _ = run(tx, jax.jit(tx.update), p0, tx.init(p0))
            out = cross.setdefault(f"{name}-{label}", {})
            try:
                with jax.set_mesh(mesh):
                    params = jax.device_put(p0, {"v": NamedSharding(mesh, spec)})
                    s0 = tx.init(params)
                    _, s1 = tx.update(grads(params, 0), s0, params)
                    _, s2 = jax.jit(tx.update)(grads(params, 0), s0, params)
                    types = [jax.tree.map(jax.typeof, x) for x in (s0, jax.jit(tx.init)(params))]
                    out["stable"] = types[0] == types[1] and (
                        jax.tree.map(jax.typeof, s1) == jax.tree.map(jax.typeof, s2)
                    )
                    out["init_matches_update"] = types[0] == jax.tree.map(jax.typeof, s1)
                    got, state = run(tx, jax.jit(tx.update), params, s0)
                    text = jax.jit(tx.update).lower(grads(params, 0), s0, params).compile()
                out["gathers"] = [g for g in gathers(text.as_text()) if "all-gather" in g]
                out["sketch_specs"] = sorted(
                    {str(spec_of(x)) for x in jax.tree.leaves(state) if x.shape[-1:] == (256,)}
                )
                out["diff"] = float(np.max(np.abs(np.asarray(got["v"]) - np.asarray(ref["v"]))))
            except Exception as err:
                out["error"] = f"{type(err).__name__}: {err}"[:600]
    extras["cross"] = cross
    from sketchopt import _solvers
    batched = _solvers.batching_active()
    print("RESULTS" + json.dumps({"families": results, "extras": extras, "batched": batched}))
    """
)


def _modes(name):
    return [mode for mode in MODES if mode == "explicit" or name in AUTO]


#: The families whose update factorizes (an ``eigh`` or QR per group), run once more with the
#: batched factorizations on (``SKETCHOPT_BATCHED_SOLVES=1``: the default on a GPU or TPU,
#: where meshes are used; off on the CPU).
BATCHED = ("ada_fd", "ada_fd_robust_fast", "ada_fd_l1", "fd_son", "kron_fd")


def _run_script(tmp, families: dict, **env_extra) -> dict:
    """The 8-device checks of ``families`` (name -> (source, modes)) in a subprocess."""
    script = tmp / "sharded_checks.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, **env_extra)
    env["JAX_PLATFORMS"] = "cpu"
    # 8 simulated devices; on a loaded 2-core machine the 8 device threads can be slow to meet
    # in a collective, so XLA's default 40 s rendezvous timeout is raised.
    env["XLA_FLAGS"] = " ".join(
        [
            env.get("XLA_FLAGS", ""),
            "--xla_force_host_platform_device_count=8",
            "--xla_cpu_collective_call_terminate_timeout_seconds=900",
            "--xla_cpu_collective_timeout_seconds=900",
        ]
    ).strip()
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(families), str(tmp / "ckpt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    data = json.loads(lines[-1][len("RESULTS") :])
    print(json.dumps(data, indent=1))  # the measured figures, shown with pytest -s
    return data


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    families = {name: (source, _modes(name)) for name, (source, _) in FAMILIES.items()}
    # the per-group program, whatever the environment says (the batched one: below)
    return _run_script(tmp_path_factory.mktemp("sharding"), families, SKETCHOPT_BATCHED_SOLVES="0")


@pytest.fixture(scope="module")
def batched_results(tmp_path_factory):
    families = {name: (FAMILIES[name][0], _modes(name)) for name in BATCHED}
    return _run_script(
        tmp_path_factory.mktemp("sharding_batched"), families, SKETCHOPT_BATCHED_SOLVES="1"
    )


def _sketch_sized(gather):
    """An all-gather (or all-to-all) of a ``(..., d)`` array: more than one non-unit dimension, one
    of them at least the smallest sharded ``d`` (16). ``k x k`` Gram-sized gathers are harmless."""
    dims = [int(x) for x in gather.split("[", 1)[1].rstrip("]").split(",") if x]
    dims = [n for n in dims if n > 1]  # a (1, d) row is a vector
    return len(dims) > 1 and max(dims) >= 16


def _check_families(results, subtests, record_property, suffix=""):
    """The per-family checks of the 8-device run (one subtest per family and mode)."""
    for name, modes in results["families"].items():
        assert set(modes) == set(_modes(name))
        for mode in _modes(name):
            with subtests.test(family=name, mode=mode):
                out = modes[mode]
                assert "error" not in out, (out.get("error"), out.get("where"))
                record_property(f"max_abs_diff[{name}-{mode}{suffix}]", out["diff"])
                assert out["diff"] <= LOOSER.get(name, TOLERANCE), out["diff"]
                assert out["sharding_ok"]
                assert out["param_specs"] == {"w": ["model", None], "b": ["model"], "s": []}
                if name == "kron_fd":  # sketch rows and inverse-root bases of each side
                    assert out["factor_specs"] == {
                        "left": ["[None, 'model']"],
                        "right": ["[None, None]"],
                    }, out["factor_specs"]
                elif any(k in name for k in ("fd", "son", "radagrad")) and name != "ons":
                    assert out["sketch_specs"] == ["[None, 'model']"], out["sketch_specs"]
                if mode == "explicit":
                    assert out["plain_init_ok"]
                allowed = FAMILIES[name][1]
                if allowed == "none":
                    assert out["gathers"] == [], out["gathers"]
                elif allowed == "vectors":
                    assert not [g for g in out["gathers"] if _sketch_sized(g)], out["gathers"]


@pytest.mark.first
@pytest.mark.slow
@pytest.mark.devices  # a tier of its own (make test-devices): about a minute of make test's time
def test_sharded_matches_single_device(results, subtests, record_property):
    """Every family in both modes (one subtest each), then the orbax restore.

    One test item with subtests rather than parametrized items: the 8-device subprocess behind
    ``results`` takes minutes, and each xdist worker that ran one of the items ran it again.
    """
    assert not results["batched"]
    _check_families(results, subtests, record_property)
    assert set(results["families"]) == set(FAMILIES)
    with subtests.test("orbax restores into the sharded layout"):
        extras = results["extras"]
        assert "error" not in extras, extras["error"]
        assert extras["orbax_equal"] and extras["orbax_sharding_ok"]
        # the last group, w's (4, 256) rows, one leaf: stored unstacked
        assert extras["orbax_rows_spec"] == [None, "model"]
        assert extras["constrain_rows_spec"] == [None, "model"]
    for case, out in results["extras"]["cross"].items():
        with subtests.test("a parameter split along a non-leading axis", case=case):
            assert "error" not in out, out.get("error")
            assert out["stable"] and out["init_matches_update"]
            assert out["diff"] <= TOLERANCE, out["diff"]
            assert out["gathers"] == [], out["gathers"]  # the flat vector moves all-to-all
            # the (k, 256) sketch rows (and (256,)-flat accumulators) stay split
            assert all("model" in spec for spec in out["sketch_specs"]), out["sketch_specs"]


# ----------------------------------------------------------------------------------------------
# The layout rules, in-process on a one-device mesh.


@pytest.fixture
def mesh():
    return jax.make_mesh((1, 1), ("data", "model"))


def _specs(tree):
    return [s.spec for s in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, NamedSharding))]


def _group(field, params, key):
    """The stacked group (of a per-leaf state field, a ``LeafGroups``) holding leaf ``key``."""
    index = sorted(params).index(key)  # jax.tree.leaves orders dict keys
    for members, value in zip(field.layout.groups, field.groups, strict=True):
        if index in members:
            return value
    raise KeyError(key)


@pytest.mark.slow
@pytest.mark.devices
def test_sharded_batched_factorizations_match_single_device(
    batched_results, subtests, record_property
):
    """The families that factorize, with the batched factorizations on (the default on a GPU or
    TPU): the same checks as above."""
    assert batched_results["batched"] and set(batched_results["families"]) == set(BATCHED)
    _check_families(batched_results, subtests, record_property, suffix="-batched")


def test_state_sharding_rules(mesh):
    params = {
        "w": jnp.zeros((8, 3)),
        "v": jnp.zeros((8, 3)),
        "b": jnp.zeros((4,)),
        "s": jnp.zeros(()),
    }
    shard = {
        "w": NamedSharding(mesh, P("model", None)),
        "v": NamedSharding(mesh, P("model", None)),
        "b": NamedSharding(mesh, P(("data", "model"))),
        "s": NamedSharding(mesh, P()),
    }
    tx = optax.chain(optax.clip(1.0), so.ada_fd_dual_averaging(0.1, 3, 0.1, robust=False))
    state = jax.eval_shape(tx.init, params)
    out = sharding.state_sharding(state, shard, params)
    da = out[1]
    ms = da.metric_state
    # Per-leaf values are stacked by leaf shape along a leading axis: (2, 3, 24) sketch rows of
    # w and v; a group of one leaf is stored unstacked: b's (3, 4) rows.
    assert _group(ms.rows, params, "w").spec == P(None, None, "model")
    assert _group(ms.rows, params, "v") == _group(ms.rows, params, "w")
    assert _group(ms.gram, params, "w").spec == P()  # (2, 3, 3)
    assert _group(ms.count, params, "w").spec == P()
    # the parameter-shaped fields are trees like the parameters, sharded like them
    assert da.grad_sum["w"].spec == P("model", None)
    assert da.anchor["w"].spec == P("model", None)
    assert _group(ms.rows, params, "b").spec == P(None, ("data", "model"))
    assert da.grad_sum["s"].spec == P() and da.count.spec == P()
    ftrl = sharding.state_sharding(so.ftrl_proximal(0.1).init(params), shard, params)
    assert ftrl.z["w"].spec == P("model", None) and ftrl.sqrt_n["b"].spec == P(("data", "model"))
    assert _group(ftrl.steps, params, "w").spec == P()


def test_state_sharding_from_sharded_arrays_and_specs(mesh):
    params = jax.device_put(
        {"w": jnp.zeros((8, 3)), "b": jnp.zeros((5,))},
        {"w": NamedSharding(mesh, P("model")), "b": NamedSharding(mesh, P())},
    )
    tx = so.ada_fd(0.1, 2, 0.1, robust=False)
    state = tx.init(params)
    from_arrays = sharding.state_sharding(state, params)
    # one leaf per group: the (2, 24) rows unstacked
    assert _group(from_arrays.metric_state.rows, params, "w").spec == P(None, "model")
    assert _group(from_arrays.metric_state.rows, params, "b").spec == P()
    with pytest.raises(ValueError, match="params="):
        sharding.state_sharding(state, {"w": P("model"), "b": P()})
    with pytest.raises(ValueError, match="mesh"):
        sharding.state_sharding(state, {"w": P("model"), "b": P()}, params)
    with jax.set_mesh(mesh):
        specs = sharding.state_sharding(state, {"w": P("model"), "b": P()}, params)
    assert _group(specs.metric_state.rows, params, "w") == P(None, "model")
    explicit = sharding.state_sharding(state, {"w": P("model"), "b": P()}, params, mesh=mesh)
    assert isinstance(_group(explicit.metric_state.rows, params, "w"), NamedSharding)


def test_state_sharding_replicates_what_cannot_be_split():
    mesh = jax.make_mesh((1,), ("model",))
    # a mesh axis of size 3 does not divide d = 8: described with an abstract 3-device mesh
    abstract = jax.sharding.AbstractMesh((3,), ("model",))
    params = {"w": jax.ShapeDtypeStruct((8,), jnp.float32)}
    state = jax.eval_shape(so.ada_fd(0.1, 2, 0.1, robust=False).init, params)
    specs = sharding.state_sharding(state, {"w": P("model")}, params, mesh=abstract)
    assert _group(specs.metric_state.rows, params, "w") == P()
    specs = sharding.state_sharding(state, {"w": P("model")}, params, mesh=mesh)
    assert _group(specs.metric_state.rows, params, "w").spec == P(None, "model")


def test_init_and_abstract_state_on_one_device(mesh):
    params = jax.device_put({"w": jnp.ones((4, 2))}, {"w": NamedSharding(mesh, P("model"))})
    tx = so.rfd_son(3, alpha0=0.0)
    state = sharding.init(tx, params)
    target = sharding.abstract_state(tx, params)
    assert jax.tree.structure(state) == jax.tree.structure(target)
    for x, t in zip(jax.tree.leaves(state), jax.tree.leaves(target), strict=True):
        assert x.shape == t.shape and x.dtype == t.dtype
        assert x.sharding.is_equivalent_to(t.sharding, x.ndim)
    ref = tx.init({"w": jnp.ones((4, 2))})
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref), strict=True):
        assert jnp.array_equal(a, b)


def test_flat_axes():
    assert sharding.flat_axes(P("model", None), 2) == ("model",)
    assert sharding.flat_axes(P(("data", "model")), 1) == ("data", "model")
    assert sharding.flat_axes(P(None, "model"), 2) == ("model",)
    assert sharding.flat_axes(P(), 0) == ()
    with pytest.raises(ValueError):
        sharding.flat_axes(P("a", "b"), 1)
