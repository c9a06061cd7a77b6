"""What to watch in a running optimizer: :func:`diagnostics` of any state that holds sketchopt's.

Every transform of this package skips, rather than applies, a leaf update whose gradient or result
is non-finite (``docs/guides/bad_input.md``): the state stays as it was, the update is zero, and
the transform's ``nonfinite_count`` grows. That keeps a run alive through a bad batch, and it also
means a run can stall in silence: a loss that grows by orders of magnitude until every step is
skipped shows up here first, as ``skipped_updates`` close to ``steps`` times the number of
leaves. The sketches' own counters say what else happened inside them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from sketchopt import _leafwise, _numerics
from sketchopt import kron as _kron
from sketchopt import sketches as _sketches

__all__ = ["diagnostics"]


#: The states of the sketches (used on their own or inside a transform's state).
_STATES = (
    _sketches.FrequentDirectionsState,
    _sketches.OjaState,
    _sketches.RandomProjectionState,
    _kron.FactorState,
)


def _fields(node) -> dict[str, Any]:
    return node._asdict() if hasattr(node, "_asdict") else {}


def _walk(node, visit) -> None:
    """Call ``visit`` on every NamedTuple state inside ``node`` (Optax's wrappers included)."""
    if isinstance(node, _leafwise.LeafGroups):
        for group in node.groups:
            _walk(group, visit)
    elif hasattr(node, "_asdict"):
        visit(node)
        for value in node:
            _walk(value, visit)
    elif isinstance(node, (tuple, list)):
        for value in node:
            _walk(value, visit)
    elif isinstance(node, dict):
        for value in node.values():
            _walk(value, visit)


def diagnostics(state: Any) -> dict[str, jax.Array]:
    """Counters and sizes to watch in a run, from the state of any sketchopt transform (alone, in
    ``optax.chain``, ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``nnx.Optimizer``'s
    ``opt_state``, ...); works under ``jit``.

    Returns a dict of scalars:

    * ``steps``: the largest ``count`` of the sketchopt transforms in the state (updates taken);
    * ``skipped_updates``: the leaf updates the transforms skipped for a non-finite gradient or
      result (their ``nonfinite_count``, summed). Non-zero means bad input or a run that left
      float range; close to ``steps`` times the number of leaves, that nothing learns any more;
    * ``rejected_rows``: rows a sketch used on its own (:mod:`sketchopt.sketches`) rejected for
      NaN/Inf;
    * ``eigh_fallbacks``: shrinks whose arrowhead eigen-update did not converge and took
      ``eigh`` (numerically hard sketches; harmless, but worth knowing);
    * ``sketch_mass``: ``sum ||B||_F^2`` over the frequent-directions sketches (both sides of
      ``kron_fd``'s), the squared gradient norm the sketches hold;
    * ``ridge``: the largest RFD ridge ``alpha_t`` among them: RFD's share of the mass the
      sketches shrank away (half of it for ``robust=True``, all of it for ``s_adagrad``). A ridge
      that grows as fast as ``sketch_mass`` means the sketch is too small for the gradients'
      spectrum; one far above the gradients' squared norm, that the step outside the sketch
      (``eta / (delta + sqrt(alpha_t))``) has become tiny.

    Args:
      state: an optimizer state (any pytree holding sketchopt states).

    Returns:
      The dict above (int32 counters and float32 sizes, zero where nothing of the kind is held).

    Raises:
      ValueError: ``state`` holds no state of a sketchopt transform or sketch at all (an
        ``optax.adam`` state, say), where every counter would read zero and say nothing. A chain
        that holds one sketchopt transform among Optax's is read as above.

    References:
      None: monitoring helpers of this package (the non-finite policy: ``docs/design.md``, "Bad
      input"; RFD's ridge: Luo et al., "Robust Frequent Directions", JMLR 20 (2019), Alg. 2).

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.ada_fd(0.1)
      >>> params = {"w": jnp.zeros(3)}
      >>> state = tx.init(params)
      >>> _, state = tx.update({"w": jnp.array([1.0, jnp.nan, 0.0])}, state)
      >>> _, state = tx.update({"w": jnp.array([3.0, 4.0, 0.0])}, state)
      >>> d = sketchopt.diagnostics(state)
      >>> int(d["steps"]), int(d["skipped_updates"]), float(d["sketch_mass"])
      (2, 1, 25.0)
    """
    totals = {
        "steps": [jnp.zeros((), jnp.int32)],
        "skipped_updates": [],
        "rejected_rows": [],
        "eigh_fallbacks": [],
        "sketch_mass": [],
        "ridge": [jnp.zeros((), jnp.float32)],
    }
    found = []

    def visit(node):
        fields = _fields(node)
        if isinstance(node, _STATES) or ("nonfinite_count" in fields and "count" in fields):
            found.append(type(node).__name__)
        if isinstance(node, _sketches.FrequentDirectionsState):
            scale = 2 * jnp.asarray(node.scale_exp, jnp.int32)
            trace = jnp.trace(node.gram, axis1=-2, axis2=-1)
            totals["sketch_mass"].append(jnp.sum(_numerics.ldexp(trace, scale)))
            totals["ridge"].append(jnp.max(_numerics.ldexp(node.alpha, scale), initial=0))
            totals["eigh_fallbacks"].append(jnp.sum(node.eigh_fallbacks))
            totals["rejected_rows"].append(jnp.sum(node.nonfinite_count))
        elif isinstance(node, _kron.FactorState):
            scale = 2 * jnp.asarray(node.exp, jnp.int32)
            mass = jnp.sum(jnp.square(node.rows), axis=(-2, -1))
            totals["sketch_mass"].append(jnp.sum(_numerics.ldexp(mass, scale)))
            totals["ridge"].append(jnp.max(_numerics.ldexp(node.alpha, scale), initial=0))
        elif isinstance(node, (_sketches.OjaState, _sketches.RandomProjectionState)):
            totals["rejected_rows"].append(jnp.sum(node.nonfinite_count))
        elif "nonfinite_count" in fields and "count" in fields:  # a transform's own state
            totals["steps"].append(jnp.max(jnp.asarray(node.count, jnp.int32), initial=0))
            totals["skipped_updates"].append(jnp.sum(node.nonfinite_count))

    _walk(state, visit)
    if not found:
        raise ValueError(
            f"diagnostics: this state ({type(state).__name__}) holds no state of a sketchopt "
            "transform or sketch, so there is nothing to report; pass the state of a sketchopt "
            "transform, alone or inside an Optax chain or wrapper"
        )
    out = {}
    for key, values in totals.items():
        if key in ("steps", "ridge"):
            out[key] = jnp.max(jnp.stack([jnp.asarray(v, values[0].dtype) for v in values]))
        elif key == "sketch_mass":
            out[key] = sum(
                (jnp.asarray(v, jnp.float32) for v in values), jnp.zeros((), jnp.float32)
            )
        else:
            out[key] = sum((jnp.asarray(v, jnp.int32) for v in values), jnp.zeros((), jnp.int32))
    return out
