"""One validation rule for every constructor's hyperparameters (``docs/design.md``, "Bad input").

* A concrete value (a Python or NumPy number, a concrete ``jax.Array`` of one element) is checked
  at construction and an invalid one raises ``ValueError`` naming the argument, the requirement,
  the value and, where a value is invalid only for one method, why.
* A traced value (under ``jit``, ``vmap`` or ``optax.inject_hyperparams``) cannot be inspected and
  is accepted as it is, by every constructor alike.
* Booleans are not numbers; a schedule (a callable of the step count) is accepted only where the
  argument is documented to take one (it is checked by its own constructor).
* Sizes (``sketch_size``, ``period``) fix array shapes or loop structure: they must be concrete
  Python (or NumPy) integers, never traced.

Arguments of the same role go through the same helper everywhere: :func:`step_size` (learning
rates, ``eta``, ``curvature``), :func:`ridge` (``delta``, ``alpha``, ``alpha0``),
:func:`strength` (``l1``, ``l2``, ``gravity``), :func:`fraction`, :func:`size`, :func:`flag`,
:func:`prng_key`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import numpy as np

__all__ = [
    "flag",
    "fraction",
    "is_traced",
    "period",
    "prng_key",
    "ridge",
    "spec_key",
    "scalar",
    "size",
    "step_size",
    "strength",
    "value_eq",
    "value_hash",
]


def is_traced(value: Any) -> bool:
    """Whether ``value`` is (or holds) a tracer: abstract, so it cannot be checked."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value))


def _number(name: str, value: Any, requirement: str, why: str | None) -> float:
    """``value`` as a float, or a ``ValueError`` if it is not one concrete real number."""
    if isinstance(value, (bool, np.bool_)):
        _fail(name, value, requirement, why)
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything not array-like is rejected below
        _fail(name, value, requirement, why)
    if array.size != 1 or not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        _fail(name, value, requirement, why)
    return float(array.reshape(()))


def _fail(name, value, requirement, why):
    reason = f" ({why})" if why else ""
    raise ValueError(f"{name} must be {requirement}, got {value!r}{reason}")


def scalar(
    name: str,
    value: Any,
    *,
    low: float = 0.0,
    low_open: bool = False,
    high: float = math.inf,
    high_open: bool = False,
    allow_inf: bool = False,
    schedule: bool = False,
    why: str | None = None,
):
    """Check one hyperparameter against ``low <(=) value <(=) high`` and return it unchanged.

    Traced values pass as they are; callables pass only with ``schedule``. Non-finite values are
    rejected unless ``allow_inf`` (``+inf`` then satisfies an open or closed ``high = inf``).
    """
    if schedule and callable(value):
        return value
    if is_traced(value):
        return value
    lower = f"> {low:g}" if low_open else f">= {low:g}"
    upper = "" if high == math.inf else (f" and < {high:g}" if high_open else f" and <= {high:g}")
    kind = "a number" if allow_inf else "a finite number"
    requirement = f"{kind} {lower}{upper}" + (" or a schedule" if schedule else "")
    x = _number(name, value, requirement, why)
    ok = (not math.isnan(x)) and (allow_inf or math.isfinite(x))
    ok = ok and (x > low if low_open else x >= low)
    ok = ok and (x < high if high_open else x <= high)
    if not ok:
        _fail(name, value, requirement, why)
    return value


def step_size(name: str, value: Any, *, positive: bool = False, why: str | None = None):
    """A step size (``learning_rate``, ``eta``, ``curvature``): ``>= 0`` (``> 0`` with
    ``positive``, which needs a ``why``), a float, an array or an Optax schedule."""
    return scalar(name, value, low_open=positive, schedule=True, why=why)


def ridge(name: str, value: Any, *, positive: bool = False, why: str | None = None):
    """A ridge (``delta``, ``alpha``, ``alpha0``): a finite number ``>= 0`` (``> 0`` with
    ``positive``, where the method needs an invertible matrix: say why)."""
    return scalar(name, value, low_open=positive, why=why)


def strength(name: str, value: Any, *, allow_inf: bool = False, why: str | None = None):
    """A regularization strength or threshold (``l1``, ``l2``, ``gravity``, ``theta``):
    ``>= 0``, finite unless ``allow_inf``."""
    return scalar(name, value, allow_inf=allow_inf, why=why)


def fraction(name: str, value: Any, *, low_open: bool = False, why: str | None = None):
    """A fraction in ``[0, 1]`` (``(0, 1]`` with ``low_open``)."""
    return scalar(name, value, low_open=low_open, high=1.0, why=why)


def size(name: str, value: Any, *, low: int = 1) -> int:
    """A size (``sketch_size``): a concrete integer ``>= low``, returned as a Python ``int``.

    Sizes fix array shapes, so they cannot be traced (under ``optax.inject_hyperparams`` list
    them in ``static_args``, or use :func:`sketchopt.inject_hyperparams`).
    """
    requirement = f"an int >= {low} (it fixes array shapes, so it cannot be traced)"
    if isinstance(value, (bool, np.bool_)) or is_traced(value):
        _fail(name, value, requirement, None)
    array = np.asarray(value) if not isinstance(value, numbers.Integral) else None
    if array is not None and (array.size != 1 or not np.issubdtype(array.dtype, np.integer)):
        _fail(name, value, requirement, None)
    number = int(value) if array is None else int(array.reshape(()))
    if number < low:
        _fail(name, value, requirement, None)
    return number


def period(name: str, value: Any):
    """A period (truncated gradient's ``k``): an integer ``>= 1``; integer arrays may be traced."""
    requirement = "an int >= 1"
    dtype = getattr(value, "dtype", None)
    integral = isinstance(value, numbers.Integral) or (
        dtype is not None and np.issubdtype(np.dtype(dtype), np.integer)
    )
    if isinstance(value, (bool, np.bool_)) or not integral:
        _fail(name, value, requirement, None)
    if not is_traced(value) and not np.all(np.asarray(value) >= 1):
        _fail(name, value, requirement, None)
    return value


def flag(name: str, value: Any) -> bool:
    """A Python (or NumPy) bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def prng_key(name: str, value: Any):
    """A JAX PRNG key (a typed key, or a raw ``uint32[2]`` key); may be traced."""
    if value is None:
        raise ValueError(f"{name} must be a JAX PRNG key (e.g. jax.random.key(0)), got None")
    if is_traced(value):
        return value
    try:
        array = jax.numpy.asarray(value)
    except Exception:  # noqa: BLE001
        raise ValueError(f"{name} must be a JAX PRNG key, got {value!r}") from None
    typed = jax.dtypes.issubdtype(array.dtype, jax.dtypes.prng_key)
    raw = array.dtype == np.uint32 and array.shape[-1:] == (2,)
    if not (typed or raw):
        raise ValueError(f"{name} must be a JAX PRNG key, got {value!r}")
    return value


def spec_key(*parts: Any):
    """A hashable key identifying a constructor call by the values of its arguments, or ``None``
    when one of them is traced or not hashable. Concrete arrays (PRNG keys) count by value."""

    def one(value):
        if is_traced(value):
            raise TypeError("traced")
        if isinstance(value, (jax.Array, np.ndarray)):
            array = np.asarray(
                jax.random.key_data(value)
                if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)
                else value
            )
            return ("array", array.dtype.str, array.shape, array.tobytes())
        hash(value)
        return value

    try:
        return tuple(one(p) for p in parts)
    except TypeError:
        return None


def value_eq(self, other):
    """``__eq__`` of a NamedTuple of functions with a ``spec`` field (see :func:`spec_key`): two
    objects built by the same constructor from equal arguments compare equal, so a compiled
    update keyed by them (``sketchopt._leafwise.compiled``) is found again when a transform is
    rebuilt with a new, equal metric. Without a ``spec`` they compare as tuples (by identity of
    their functions)."""
    if self.spec is not None and type(other) is type(self):
        return self.spec == other.spec
    return tuple.__eq__(self, other)


def value_hash(self):
    """``__hash__`` matching :func:`value_eq`."""
    if self.spec is not None:
        return hash((type(self).__name__, self.spec))
    return tuple.__hash__(self)
