"""Smoke test of an *installed* sketchopt, run from outside the checkout.

Usage: ``python .ci/smoke.py REPO`` with the package installed in the running interpreter (a
built wheel in a clean environment, see ``make smoke-wheel``). Checks that

* ``sketchopt`` is imported from the installed copy, and that copy holds every module of the
  checkout's ``sketchopt/`` (a subpackage missing from the wheel fails here);
* one transform of each family compiles under ``jax.jit`` and takes a finite step;
* a Flax ``nnx.Optimizer`` step runs (when Flax is installed);
* the experiments runner answers ``--help`` with this installed package.

It prints the versions it ran against, so a breaking JAX/Optax/Flax release shows up by name.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import shutil
import subprocess
import sys
import tempfile


def check_installed_copy(repo: pathlib.Path) -> None:
    import sketchopt

    installed = pathlib.Path(sketchopt.__file__).resolve().parent
    source = (repo / "sketchopt").resolve()
    assert installed != source, f"sketchopt was imported from the checkout ({installed})"
    wanted = {p.relative_to(source) for p in source.rglob("*.py")}
    have = {p.relative_to(installed) for p in installed.rglob("*.py")}
    missing = sorted(str(p) for p in wanted - have)
    assert not missing, f"the installed package lacks {missing}"
    print(f"sketchopt {sketchopt.__version__} from {installed}: {len(wanted)} modules present")


def check_transforms() -> None:
    import jax
    import jax.numpy as jnp
    import optax

    import sketchopt

    params = {"w": jnp.ones((6, 5)), "b": jnp.zeros((5,))}
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.5), params)
    for name, tx in {
        "ada_fd": sketchopt.ada_fd(0.1, 4, 1e-3, robust=False),
        "ada_fd_dual_averaging": sketchopt.ada_fd_dual_averaging(0.1, 4, 1e-3, robust=False),
        "fd_son": sketchopt.fd_son(1.0, 4),
        "ftrl_proximal": sketchopt.ftrl_proximal(0.1, 1.0, 0.01, 0.0),
        "chain": optax.chain(optax.clip_by_global_norm(1.0), sketchopt.ada_diag(0.1, 1e-6)),
    }.items():
        state = tx.init(params)
        updates, state = jax.jit(tx.update)(grads, state, params)
        leaves = jax.tree.leaves(updates)
        assert all(bool(jnp.all(jnp.isfinite(u))) for u in leaves), name
        assert any(bool(jnp.any(u != 0)) for u in leaves), name
    print("transforms: ada_fd, dual averaging, fd_son, ftrl_proximal, chain: ok")


def check_flax() -> None:
    try:
        from flax import nnx
    except ImportError:
        print("flax: not installed, skipped")
        return
    import jax.numpy as jnp

    import sketchopt

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, sketchopt.ada_fd(0.1, 4, 1e-3, robust=False), wrt=nnx.Param)
    x = jnp.ones((8, 3))

    def loss_fn(m):
        return jnp.mean(m(x) ** 2)

    before = loss_fn(model)
    for _ in range(3):
        grads = nnx.grad(loss_fn)(model)
        optimizer.update(model, grads)
    after = loss_fn(model)
    assert after < before, (before, after)
    print(f"flax nnx.Optimizer: loss {float(before):.4f} -> {float(after):.4f}")


def check_experiments_runner(repo: pathlib.Path) -> None:
    # A copy of experiments/ alone: run.py puts its parent on sys.path, which must not hold a
    # sketchopt/ that would shadow the installed package.
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(repo / "experiments", pathlib.Path(tmp) / "experiments")
        out = subprocess.run(
            [sys.executable, str(pathlib.Path(tmp) / "experiments" / "run.py"), "--help"],
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp,
        )
    assert "usage" in out.stdout.lower(), out.stdout
    print("experiments/run.py --help: ok")


def main() -> None:
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    versions = {}
    for dist in ("jax", "jaxlib", "optax", "chex", "numpy", "flax"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "-"
    print("python", sys.version.split()[0], " ".join(f"{k} {v}" for k, v in versions.items()))
    check_installed_copy(repo)
    check_transforms()
    check_flax()
    check_experiments_runner(repo)
    print("smoke test passed")


if __name__ == "__main__":
    main()
