"""VW's ``-q`` crosses built inside the compiled step (:mod:`sketchopt.stream.crosses`)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sketchopt.stream import cli, crosses, data, learners, runner
from sketchopt.stream.examples import to_dense


def vw_lines(n: int, seed: int = 0) -> list[str]:
    """Examples with a namespace crossed with itself and two crossed with each other; some miss
    a namespace, some repeat a feature, one has no feature at all."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        fa = rng.integers(0, 12, rng.integers(0, 6))
        fb = rng.integers(0, 12, rng.integers(0, 4))
        y = int((fa.sum() + 2 * fb.sum()) % 3 == 0)
        a = " ".join(f"f{v}:{rng.normal():.3f}" for v in fa)
        b = " ".join(f"g{v}" for v in fb)
        lines.append(f"{y} |a {a} |b {b} |c z\n" if i % 17 else f"{y} |c\n")
    return lines


def expanded(chunk):
    """The device's de-duplicated vectors of a crossed chunk: dense rows, and whether each
    row's non-padding indices were distinct."""
    layout = chunk.layout

    def body(tables, entries):
        total, tables = crosses.expand(entries, tables, layout)
        x = crosses.as_vector(total, tables, layout)
        dense = jnp.zeros(layout.dim + 1).at[x.indices].add(x.values)[: layout.dim]
        live = jnp.where(x.indices < layout.dim, x.indices, -1 - jnp.arange(x.indices.size))
        distinct = jnp.unique_counts(live, size=x.indices.size).counts.max() == 1
        return tables, (dense, distinct)

    entries = chunk.entries
    run = jax.jit(lambda t, e: jax.lax.scan(body, t, e)[1])
    dense, distinct = run(crosses.scratch(layout, jnp.float32), entries)
    return np.asarray(dense), np.asarray(distinct)


@pytest.mark.parametrize("bits", [4, 12])
def test_device_crosses_equal_the_definition_and_the_host(bits):
    """At ``2**4`` most crosses collide: their values must be summed into one entry each."""
    lines = vw_lines(40)
    quadratic = ["ab", "aa", "cb"]
    host, d = data.read_vw(lines, bits=bits, quadratic=quadratic, constant=True)
    chunks = list(
        data.iter_vw(lines, bits=bits, quadratic=quadratic, constant=True, chunk_size=16,
                     crosses="device", width=8)
    )  # fmt: skip
    assert all(c.layout.square == (False, True, False) for c in chunks)
    reference = np.concatenate([crosses.dense_reference(c)[c.mask] for c in chunks])
    np.testing.assert_allclose(reference, to_dense(host, d), atol=1e-6)
    got = [expanded(c) for c in chunks]
    dense = np.concatenate([g[0][c.mask] for g, c in zip(got, chunks, strict=True)])
    np.testing.assert_allclose(dense, reference, atol=1e-5)
    assert all(g[1].all() for g in got)


def test_the_pairs_table_is_exact():
    i, j = crosses.pair_table(5000, 8)
    i, j = np.asarray(i)[8:-8], np.asarray(j)[8:-8]
    r = j * (j + 1) // 2 + i
    np.testing.assert_array_equal(r, np.arange(5000))
    assert (i <= j).all() and (i >= 0).all()


@pytest.mark.parametrize("name", ["ftrl", "oja_son"])  # a first- and a second-order step_flat
def test_a_pass_on_device_crosses_equals_the_stored_crosses(name):
    lines = vw_lines(200, seed=1)
    learner = learners.make_learner(name)
    opts = {"bits": 8, "quadratic": ["ab", "aa"], "constant": True, "chunk_size": 64}
    dim = 2**8 + 1
    stored = runner.as_flat(data.iter_vw(lines, **opts), dim, 16)
    key = jax.random.PRNGKey(0)
    ours = runner.run_stream(
        learner, data.iter_vw(lines, **opts, crosses="device", width=16), dim, key=key
    )
    theirs = runner.run_stream(learner, stored, dim, key=key)
    np.testing.assert_allclose(ours.progress.loss_sum, theirs.progress.loss_sum, rtol=1e-4)
    np.testing.assert_allclose(
        learner.weights(ours.state), learner.weights(theirs.state), rtol=1e-3, atol=1e-5
    )
    test_ours = runner.evaluate(learner, ours.state, data.iter_vw(lines, **opts, crosses="device"))
    test_theirs = runner.evaluate(learner, ours.state, data.iter_vw(lines, **opts))
    np.testing.assert_allclose(test_ours[2], test_theirs[2], rtol=1e-4, atol=1e-5)


def test_cli_crosses_on_device_resume_and_passes(tmp_path):
    """``-q`` runs crossed on the device by default, exactly as the stored crosses of
    ``--layout flat`` learn; a checkpoint keeps the layout, and resuming continues it."""
    train = tmp_path / "train.vw"
    train.write_text("".join(vw_lines(300, seed=2)))
    out, model = tmp_path / "s.json", tmp_path / "model"
    flags = [str(train), "-q", "ab", "-q", "aa", "--json", str(out), "--quiet"]
    assert cli.main([*flags, "--passes", "2", "-f", str(model)]) == 0
    crossed = json.loads(out.read_text())
    assert crossed["layout"] == "crossed" and crossed["width"] >= 64
    assert cli.main([*flags, "--passes", "2", "--layout", "flat"]) == 0
    stored = json.loads(out.read_text())
    for key in ("progressive_loss", "holdout_loss"):
        assert crossed[key] == pytest.approx(stored[key], rel=1e-5)
    assert cli.main([str(train), "-i", str(model), "--json", str(out), "--quiet"]) == 0
    resumed = json.loads(out.read_text())
    assert resumed["layout"] == "crossed" and resumed["width"] == crossed["width"]
    assert resumed["examples"] == crossed["examples"] + 300
