"""What the tests that read a jaxpr share: its equations, with those of every jaxpr inside it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def all_eqns(jaxpr) -> Iterator[Any]:
    """Every equation of ``jaxpr`` (a ``Jaxpr``) and of the jaxprs inside it: a ``jit``'s, a
    ``cond``'s or ``switch``'s branches, a loop's body."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for x in value if isinstance(value, (tuple, list)) else (value,):
                inner = x.jaxpr if hasattr(x, "consts") else x if hasattr(x, "eqns") else None
                if inner is not None:
                    yield from all_eqns(inner)


def count(jaxpr, primitive: str) -> int:
    """How many equations of ``jaxpr`` (and of the jaxprs inside it) apply ``primitive``."""
    return sum(e.primitive.name == primitive for e in all_eqns(jaxpr))
