"""The code paths per backend, and the switch that runs the accelerators' path on the CPU.

Three computations of the FD sketches have two implementations of the same mathematics, chosen
by the backend when an update is traced:

* the eigendecomposition of the sketch's Gram matrix after a per-step shrink, an *arrowhead*
  matrix: on a GPU or TPU a fixed-step secular-equation solve in plain array operations
  (``sketchopt._arrowhead``; ``eigh`` only where it does not converge), on the CPU LAPACK's
  ``syevd``, which is faster there;
* the null vector the lazy basis needs at every shrink: unrolled Householder reflections on an
  accelerator, LAPACK's QR on the CPU;
* the rotation of an FD sketch's rows (and the lift of its residual): on a TPU program of one
  device a Pallas kernel that rewrites the rows in place in one pass (``sketchopt._kernels``),
  elsewhere XLA's own products. ``SKETCHOPT_KERNELS=off`` keeps XLA's everywhere;
  ``SKETCHOPT_KERNELS=interpret`` runs the kernel through Pallas's interpreter on any backend
  (the tests' way to check it on a CPU).

:func:`batched_solves` runs the small factorizations of an update (each shape group's ``eigh``
and QR) batched across the groups: one solver call per kind and level of dependence, not one per
group (``sketchopt._solvers``; on the speed benchmark's 24-layer tree 2 calls for ``ada_fd`` and
``fd_son`` instead of 18, 3 for ``kron_fd`` instead of 24). It is on by default on a GPU or TPU
(measured on an NVIDIA H200: ``kron_fd``'s update in the transformer benchmark 10.2 ms, where
0.9.0's per-group program took 34-39 ms) and off on the CPU, where jaxlib runs a batched LAPACK
call as a loop over its batch; ``SKETCHOPT_BATCHED_SOLVES=1`` (or ``0``) sets it for a process.
It is tested against the per-group program on both code paths.

:func:`accelerator_path` makes the CPU trace what a GPU or TPU would, so that the tests and the
device benchmark's proxy (``experiments/device_bench.py``) cover the accelerator path on any
machine; the environment variable ``SKETCHOPT_ACCELERATOR_PATH=1`` (or ``0``) does the same for
a whole process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sketchopt import _solvers

__all__ = ["accelerator_path", "batched_solves", "uses_accelerator_path"]


@contextlib.contextmanager
def accelerator_path(enabled: bool | None = True) -> Iterator[None]:
    """Trace sketchopt's updates inside this block on the accelerator code path (``enabled``),
    on the CPU path (``False``), or on the backend's own (``None``).

    The choice is made when an update is traced: sketchopt's own compiled units (the transforms
    called outside ``jit``) key their cache on it, but a function you ``jax.jit`` yourself keeps
    the path it was first traced with. Both paths compute the same updates to rounding.

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.ada_fd(0.1)
      >>> params = {"w": jnp.ones(3)}
      >>> state = tx.init(params)
      >>> with sketchopt.accelerator_path():
      ...     updates, state = tx.update({"w": jnp.array([1.0, -2.0, 0.5])}, state, params)
      ...     sketchopt.uses_accelerator_path()
      True
    """
    with _solvers.forced_accelerator_path(enabled):
        yield


def uses_accelerator_path() -> bool:
    """Whether an update traced here takes the accelerator code path (the module docstring):
    on every backend but the CPU, unless :func:`accelerator_path` or the environment variable
    ``SKETCHOPT_ACCELERATOR_PATH`` says otherwise."""
    return _solvers.accelerator_path_active()


@contextlib.contextmanager
def batched_solves(enabled: bool | None = True) -> Iterator[None]:
    """Trace sketchopt's updates inside this block with their small factorizations batched
    across the shape groups (``enabled``), group by group (``False``), or as the environment
    variable ``SKETCHOPT_BATCHED_SOLVES`` says (``None``; unset: on a GPU or TPU, off on the
    CPU). Both compute the same updates to rounding; like :func:`accelerator_path`, the choice is
    made when an update is traced, and sketchopt's compiled units key their cache on it.

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.ada_fd(0.1, sketch_size=4)
      >>> params = {"w": jnp.zeros((80, 60)), "b": jnp.zeros(60)}
      >>> with sketchopt.batched_solves():
      ...     updates, state = tx.update(
      ...         {"w": jnp.ones((80, 60)), "b": jnp.ones(60)}, tx.init(params), params
      ...     )
      >>> updates["w"].shape
      (80, 60)
    """
    with _solvers.batching(enabled):
        yield
