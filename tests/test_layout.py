"""The package's layout contracts (issue 16): the file list shows the architecture, old import
paths keep working, and no private name crosses a module boundary.

Underscore *modules* (``sketchopt._numerics``, ``_partitioning``, ``_validation``, ``_leafwise``,
``_dct``) are the package-internal API: their public names are shared between the modules and
are the documented testing hooks. An underscore *name* (``sketches._ldexp``) is private to the
module that defines it, and nothing else may import or read it.
"""

import ast
import importlib
import pathlib

import pytest

import sketchopt as so

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _private_uses(path):
    """``from sketchopt.X import _y`` and ``X._y`` on a name bound to a sketchopt module."""
    tree = ast.parse(path.read_text(), str(path))
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sketchopt"):
            for alias in node.names:
                if node.module == "sketchopt":  # a module, underscore modules included
                    modules.add(alias.asname or alias.name)
                elif alias.name.startswith("_"):
                    found.append(f"{path.name}:{node.lineno} imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sketchopt"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr != "_replace"  # NamedTuple's public API
        ):
            base = node.value
            # so.son._rp_direction: walk the attribute chain down to its root name
            chain = [node.attr]
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{path.name}:{node.lineno} reads {base.id}.{'.'.join(chain[::-1])}")
    return found


@pytest.mark.parametrize("folder", ["sketchopt", "tests", "experiments"])
def test_no_private_name_crosses_a_module_boundary(folder):
    found = [u for p in sorted((ROOT / folder).rglob("*.py")) for u in _private_uses(p)]
    assert not found, "\n".join(found)


# Import paths of 0.2 that moved in 0.3.0 (CHANGELOG.md): old path -> new home.
MOVED = {
    "sketchopt.transforms": ("sketchopt.rules", "sketchopt.aliases"),
    "sketchopt.baselines": ("sketchopt.first_order", "sketchopt.metrics", "sketchopt.aliases"),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_paths_reexport_the_same_objects(old):
    module = importlib.import_module(old)
    homes = [importlib.import_module(m) for m in MOVED[old]]
    assert module.__all__
    for name in module.__all__:
        obj = getattr(module, name)
        assert any(getattr(h, name, None) is obj for h in homes), name
        assert getattr(so, name) is obj, name  # and from the package root, as before
