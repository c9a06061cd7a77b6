"""The package's layout contracts (issue 16): the file list shows the architecture, old import
paths keep working, and no private name crosses a module boundary; and the house: no import
circle among the package's modules, no function longer than :data:`MAX_FUNCTION_LINES`.

Underscore *modules* (``sketchopt._numerics``, ``_partitioning``, ``_validation``, ``_groups``,
``_layouts``, ``_leafwise``, ``_arrowhead``, ``_dct``, ``sketchopt.stream._base``) are the
package-internal API: their public names are shared between the modules and
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


# Names that moved below the modules that import them (no import circle): old path -> new home.
MOVED_DOWN = {
    "sketchopt._leafwise": (
        "sketchopt._groups",
        ("GROUP_AXIS", "all_leaves", "any_leaf", "grouped", "select_leaves"),
    ),
    "sketchopt.sharding": (
        "sketchopt._layouts",
        ("factor_axes", "flat_axes", "flat_spec", "group_specs"),
    ),
    "sketchopt.metrics": ("sketchopt.kron", ("KronMetricState",)),
    "sketchopt.stream.learners": (
        "sketchopt.stream._base",
        ("LOSSES", "LinearLearner", "LinearState", "check_each", "class_label", "column", "error")
        + ("grid_shape", "loss_value"),
    ),
}


@pytest.mark.parametrize("old", sorted(MOVED_DOWN))
def test_names_moved_down_keep_their_old_paths(old):
    home, names = MOVED_DOWN[old]
    module, new = importlib.import_module(old), importlib.import_module(home)
    for name in names:
        assert getattr(module, name) is getattr(new, name), name
        if isinstance(getattr(new, name), type):  # a class keeps its documented, pickled home
            assert getattr(new, name).__module__ == old, name


# Names that moved up into a family's module (issue 61: sketched Shampoo in one place, as the SON
# family is in ``son``): old path -> new home. A module above its home re-exports them; one below
# it (``metrics``) reads them from the home in its module ``__getattr__`` (PEP 562) when first
# asked, which :func:`_import_graph` does not count as an import (it runs after both modules have
# loaded), and which may import nothing but the home.
MOVED_UP = {
    "sketchopt.metrics": (
        "sketchopt.shampoo",
        ("DIAGONAL_GRAFTS", "GRAFTS", "GraftedOperator", "NormalizedOperator", "check_exponents")
        + ("kron_sketched",),
    ),
    "sketchopt.aliases": ("sketchopt.shampoo", ("kron_fd",)),
}


@pytest.mark.parametrize("old", sorted(MOVED_UP))
def test_names_moved_up_keep_their_old_paths(old):
    home, names = MOVED_UP[old]
    module, new = importlib.import_module(old), importlib.import_module(home)
    for name in names:
        obj = getattr(new, name)
        assert getattr(module, name) is obj, name
        assert getattr(importlib.import_module(old), name) is obj  # ``from old import name``
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__ == home, name  # documented once, at the new home
    graph, lazy = _import_graph(), _getattr_imports(old)
    if lazy:  # a module below the home: its __getattr__ imports the home only, nothing else does
        assert set(lazy) == {home} and home not in _reached(graph, old), lazy
        assert old in _reached(graph, home)
    else:  # a module above the home: a re-export
        assert home in graph[old]
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


# ----------------------------------------------------------------------------------------------
# The house: the import graph has no circle, no function is too long.


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted((ROOT / "sketchopt").rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_getattr(tree: ast.Module) -> ast.FunctionDef | None:
    """The module-level ``def __getattr__`` (PEP 562) of a parsed module, or ``None``."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            return node
    return None


def _imported(
    name: str, source: str, package: str, *, skip_getattr: bool = False
) -> dict[str, int]:
    """The package modules ``name`` imports, at any depth (inside functions too), each with the
    line of its first import; the body of ``if TYPE_CHECKING:`` is skipped, and with
    ``skip_getattr`` that of the module's ``__getattr__``. ``from a import b`` imports the module
    ``a.b`` where there is one, else ``a``; a name is counted as the deepest package module it
    names (``import a.b.c`` of a function ``c``: ``a.b``)."""
    found: dict[str, int] = {}
    tree = ast.parse(source, name)
    skipped = _module_getattr(tree) if skip_getattr else None

    def add(target: str, line: int) -> None:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if child is skipped:
                continue
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit_node(other)
                continue
            visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in MODULES else base, node.lineno)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                visit_node(other)
            return
        visit(node)

    visit(tree)
    return found


def _package(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _import_graph() -> dict[str, dict[str, int]]:
    """Every package module's imports (:func:`_imported`); a module that serves old paths of
    names moved up (:data:`MOVED_UP`) without its module ``__getattr__``."""
    return {
        n: _imported(n, p.read_text(), _package(n), skip_getattr=n in MOVED_UP)
        for n, p in MODULES.items()
    }


def _getattr_imports(name: str) -> dict[str, int]:
    """The package modules the module-level ``__getattr__`` of module ``name`` imports."""
    source = MODULES[name].read_text()
    function = _module_getattr(ast.parse(source, name))
    if function is None:
        return {}
    return _imported(name, ast.get_source_segment(source, function), _package(name))


def _import_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One circle of ``graph`` (``[a, b, ..., a]``), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := walk(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return None


def test_the_import_graph_has_no_circle():
    graph = _import_graph()
    assert "sketchopt._leafwise" in graph["sketchopt.rules"]  # the graph sees the imports
    cycle = _import_cycle(graph)
    assert cycle is None, (
        "import circle: "
        + " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False))
        + f" -> {cycle[-1]}"
    )


def _reached(graph, start):
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


# Below the driver: the numerics, the sketches, the arrowhead solver, the rotation kernel, the
# group context and the layout rules import neither the driver nor what builds on it.
BELOW_THE_DRIVER = (
    "_numerics",
    "_groups",
    "_arrowhead",
    "_kernels",
    "_layouts",
    "sketches",
    "kron",
)
ABOVE = ("_leafwise", "sharding", "metrics", "rules", "son", "shampoo", "aliases")


@pytest.mark.parametrize("low", BELOW_THE_DRIVER)
def test_the_layers_below_the_driver_import_nothing_above_them(low):
    reached = _reached(_import_graph(), f"sketchopt.{low}")
    assert not reached & {f"sketchopt.{high}" for high in ABOVE}, sorted(reached)


# The families' modules sit above the axes they are built on: each imports the metrics and the
# rules, and nothing of the axes imports a family back (``aliases``, the named algorithms, may
# re-export a family's transform: ``kron_fd``).
FAMILIES = ("son", "shampoo")
AXES = ("sketches", "kron", "operators", "metrics", "rules", "regularizers")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_families_sit_above_the_metrics_and_the_rules(family):
    graph = _import_graph()
    assert {"sketchopt.metrics", "sketchopt.rules"} <= set(graph[f"sketchopt.{family}"])
    for axis in AXES:
        assert f"sketchopt.{family}" not in _reached(graph, f"sketchopt.{axis}"), axis


def test_the_driver_does_not_import_sharding_and_the_learners_share_a_base():
    graph = _import_graph()
    assert "sketchopt.sharding" not in _reached(graph, "sketchopt._leafwise")
    assert "sketchopt.stream.learners" not in _reached(graph, "sketchopt.stream.second_order")
    for learners in ("sketchopt.stream.learners", "sketchopt.stream.second_order"):
        assert "sketchopt.stream._base" in graph[learners]


def test_the_import_graph_counts_deferred_imports():
    """A deferred import (inside a function) is an edge; one under ``if TYPE_CHECKING:`` is
    not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from sketchopt import rules\n"
        "def f():\n"
        "    from sketchopt.stream import learners\n"
        "    import sketchopt.kron\n"
    )
    found = _imported("sketchopt.stream._probe", source, "sketchopt.stream")
    assert set(found) == {"sketchopt.stream.learners", "sketchopt.kron"}
    # A module __getattr__ (PEP 562) is an edge unless skipped; a method of that name is not one.
    lazy = (
        "def __getattr__(name):\n"
        "    from sketchopt import shampoo\n"
        "class A:\n"
        "    def __getattr__(self, name):\n"
        "        from sketchopt import son\n"
    )
    assert set(_imported("sketchopt.metrics", lazy, "sketchopt")) == {
        "sketchopt.shampoo",
        "sketchopt.son",
    }
    skipped = _imported("sketchopt.metrics", lazy, "sketchopt", skip_getattr=True)
    assert set(skipped) == {"sketchopt.son"}
    assert _import_cycle({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}}) == ["a", "b", "c", "a"]
    assert _import_cycle({"a": {"b": 1}, "b": {}}) is None


#: The longest a function or method may be, in lines less its docstring (nested functions count
#: in the function around them, and on their own).
MAX_FUNCTION_LINES = 85


def _function_lengths(path: pathlib.Path) -> list[tuple[str, int]]:
    """``(qualified name, lines less the docstring)`` of every function and method in ``path``,
    at any depth. The lines run from the ``def`` to the function's last line (decorators
    aside)."""
    out = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                first = child.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    if isinstance(first.value.value, str):
                        lines -= first.end_lineno - first.lineno + 1
                out.append((prefix + child.name, lines))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(), str(path)), "")
    return out


def test_no_function_is_longer_than_the_limit():
    long = [
        f"{name}.{function}: {lines} lines"
        for name, path in MODULES.items()
        for function, lines in _function_lengths(path)
        if lines > MAX_FUNCTION_LINES
    ]
    assert not long, "\n".join(long)
