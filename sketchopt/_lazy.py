"""Lazy package roots (PEP 562): a package's names imported from their modules at first use, so
that importing the package (or ``sketchopt.stream.cli`` for ``--help``) loads no JAX. Imports
nothing of the package itself."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def attach(
    package: str, homes: Mapping[str, Iterable[str]], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of the package ``package`` (already in
    ``sys.modules``, as it is while its ``__init__`` runs): ``homes`` maps each of its modules
    to the names read from it, ``public`` is its ``__all__``. A name is imported from its
    module at its first use and bound in the package (the next use is a plain attribute); a
    public submodule is imported by its name; ``dir()`` gives the package's dunder names,
    ``public`` and the public submodules."""
    module = sys.modules[package]
    home = {name: mod for mod, names in homes.items() for name in names}
    public = list(public)

    def submodules() -> list[str]:
        found = pkgutil.iter_modules(module.__path__)
        return [m.name for m in found if not m.name.startswith("_")]

    def __getattr__(name: str) -> Any:
        if name in home:
            value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
            setattr(module, name, value)
            return value
        if not name.startswith("_") and name in submodules():
            return importlib.import_module(f"{package}.{name}")  # which binds it there
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        dunders = (n for n in vars(module) if n.startswith("__"))
        return sorted({*dunders, *public, *submodules()})

    return __getattr__, __dir__
