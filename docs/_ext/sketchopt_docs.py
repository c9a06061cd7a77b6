"""sketchopt's own Sphinx extension: the API reference's contract and the experiments' tables.

What it does (registered in ``docs/conf.py``):

**The API reference.** The public modules are every module of the ``sketchopt`` package whose
dotted path has no component starting with ``_``; a module's public names are its ``__all__``
(the package root, which has none, exports every name it binds that is not a module and does not
start with ``_``). Each public object is documented once, at its *home*: the public module that
defines it (``sketchopt.aliases.ada_fd``), or, for an object defined in a private module or
outside the package, the first public module that lists it (``sketchopt.rules.LeafGroups``,
defined in ``sketchopt._leafwise``). Every other module listing it -- the root ``sketchopt``, the
old import paths ``baselines`` and ``transforms``, the ``sketchopt.stream`` package -- shows it in
a table of re-exports that links to the home. That plan is handed to the autosummary templates
(``docs/_templates/autosummary/module.rst``) as the context variable ``api``.

* Each re-export path is registered in Python's domain as an alias of its home (so
  ``sketchopt.ada_fd`` is in ``objects.inv`` and resolves like any documented name).
* A cross-reference Sphinx does not find (``missing-reference``) is looked up as Python: a path
  naming a documented object another way (the re-export ``{func}`sketchopt.ada_fd```,
  ``_sketches.RandomProjectionState`` in a signature, ``:func:`ada_fd``` in another module's
  docstring, a name in the defining private module's namespace) links to its home; a path
  naming an existing object of the package that is not public (a private module or function, a
  constant not in ``__all__``) renders as code without a link; a name that exists nowhere stays
  unresolved, and Sphinx warns (an error under ``-W``).
* After the sources are read, a public module missing from the reference, or a public name whose
  home has no entry in it, is a warning of type ``sketchopt.api`` -- an error under ``-W``
  (``make docs``).

**Code spans as cross-references.** The Markdown pages and notebooks are read on GitHub too,
which shows MyST roles as raw text, so they name objects as plain code spans
(`` `sketchopt.ada_fd` ``) and other pages as relative Markdown links (``tests/test_docs.py``
keeps them free of roles). A transform (``CodeSpanReferences``) turns every code span of those
pages whose text is a dotted path into the package (``sketchopt.NAME[.NAME...]``, ``()`` allowed
after it) into a Python cross-reference (``py:obj``, the text kept as written), resolved like
any other: to the object's home, as code without a link where it names an existing object that
is not public (``sketchopt._solvers.eigh``), and a warning -- an error under ``-W`` -- where it
names nothing, so that a typo or a renamed function cannot rot in the guides. Code spans in a
title or inside a link are checked the same way but not linked; a code span that is not only a
path (``sketchopt.ada_fd(1e-3)``, ``optax.adam``) stays code. The changelog (``HISTORY_DOCS``)
names objects of past releases: there a path that no longer exists stays code. The same
transform resolves a Markdown link to a notebook by its real path (``../notebooks/NAME.ipynb``,
which GitHub follows; ``docs/notebooks`` is a symbolic link to that folder) to the page.

**Summaries.** autosummary's one-line summaries are cut at the first sentence end that is not a
paper abbreviation ("eq.", "sec.", "Alg.", ...) or inside inline markup (``_extract_summary``).

**The experiments' tables.** The directive ``results-table`` renders the tables of
``experiments/run.py``'s output (``results/NAME.json``, written by ``make run``) in a MyST page::

    ```{results-table} reproductions
    ```
    ```{results-table} claims
    ```
    ```{results-table} regret
    :claims:
    :figure:
    ```

* ``reproductions``: the headline "Reproductions" table (the claims ``run.HEADLINE`` lists, in
  its order), the README's table;
* ``claims``: every claim of every experiment;
* ``NAME`` (an experiment of ``run.EXPERIMENTS``): the experiment's own table (the JSON's
  ``"table"``, or, for results written before the JSON held it, the ``## NAME`` section of
  ``summary.md``), preceded by a line saying the size and seed it ran at; ``:claims:`` adds the
  experiment's claims, ``:figure:`` its figure ``NAME.png``.

The results folder is the configuration value ``sketchopt_results_dir`` (``docs/conf.py``:
``$SKETCHOPT_RESULTS``, else ``results/`` at the repository root). Where it holds no result for a
table the directive renders an admonition saying how to generate it (``make run``), so that the
site builds on a fresh clone; an unknown table name is a warning (an error under ``-W``). The
tables are built with the experiments' own helpers (``experiments.common.claims_markdown``), so
they are the ones ``summary.md`` shows.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import pathlib
import pkgutil
import re
import sys
import types
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.domains.python import ObjectEntry
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

PACKAGE = "sketchopt"
#: Modules whose names are all re-exports, shown last when choosing an object's home.
REEXPORTING = ("sketchopt", "sketchopt.baselines", "sketchopt.transforms", "sketchopt.stream")


# ------------------------------------------------------------------------------------------------
# The API plan.


def public_modules() -> list[str]:
    """Every public module of the package, imported (the root first, then by name)."""
    package = importlib.import_module(PACKAGE)
    names = [PACKAGE]
    for info in pkgutil.walk_packages(package.__path__, PACKAGE + "."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        names.append(info.name)
    for name in names:
        importlib.import_module(name)
    return [PACKAGE, *sorted(names[1:])]


def public_names(module: types.ModuleType) -> list[str]:
    """``module.__all__``, or (without one) every bound name that is not a module or private."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    )


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "classes"
    if callable(obj) and not isinstance(obj, dict):
        return "functions"
    return "data"


def _show_value(obj: Any) -> bool:
    """Whether ``autodata`` shows the value: short reprs only, never an address."""
    text = repr(obj)
    return len(text) <= 120 and " at 0x" not in text and "\n" not in text


@dataclasses.dataclass
class Plan:
    """What the reference documents, where.

    Attributes:
      modules: the public modules, in order.
      api: per module, what its page holds (the templates' ``api``): ``functions`` and
        ``classes`` (names documented on pages of their own), ``data`` (``[name, show_value]``,
        documented on the module's page) and ``reexported`` (``[[home module, [[name, home
        path], ...]], ...]``).
      aliases: every public path that is not a home (``sketchopt.ada_fd``) -> its home path.
      homes: ``id(obj)`` of every documented class and function -> its home path.
      objects: those objects (kept alive, so that their ids stay theirs).
    """

    modules: list[str]
    api: dict[str, dict]
    aliases: dict[str, str]
    homes: dict[int, str]
    objects: list[Any]


def build_plan(modules: list[str]) -> Plan:
    """Each public name's home and the pages that list it (module docstring)."""
    loaded = {name: importlib.import_module(name) for name in modules}
    names = {name: public_names(module) for name, module in loaded.items()}
    # Candidate homes: the defining module first, then specific modules before re-exporting ones.
    order = sorted(modules, key=lambda m: (m in REEXPORTING, m.count("."), m))

    def home(module: str, name: str) -> str:
        obj = getattr(loaded[module], name)
        defined = getattr(obj, "__module__", None)
        own = getattr(obj, "__name__", None)
        if (
            defined in loaded
            and own is not None
            and own in names[defined]
            and getattr(loaded[defined], own, None) is obj
        ):
            return f"{defined}.{own}"
        for candidate in order:
            if name in names[candidate] and getattr(loaded[candidate], name, None) is obj:
                return f"{candidate}.{name}"
        raise AssertionError((module, name))  # the module itself lists it

    plan = Plan(modules, {}, {}, {}, [])
    for module in modules:
        entry: dict[str, Any] = {"functions": [], "classes": [], "data": [], "reexported": {}}
        for name in names[module]:
            if not hasattr(loaded[module], name):
                logger.warning(
                    f"{module}.__all__ lists {name!r}, which it does not define",
                    type="sketchopt",
                    subtype="api",
                )
                continue
            obj = getattr(loaded[module], name)
            target = home(module, name)
            path = f"{module}.{name}"
            kind = _kind(obj)
            if target == path:
                entry[kind].append([name, _show_value(obj)] if kind == "data" else name)
            else:
                plan.aliases[path] = target
                home_module = target.rsplit(".", 1)[0]
                entry["reexported"].setdefault(home_module, []).append([name, target])
            if kind != "data":  # data (strings, numbers) may share an identity by accident
                plan.homes.setdefault(id(obj), target)
                plan.objects.append(obj)
        entry["reexported"] = [[m, rows] for m, rows in entry["reexported"].items()]
        plan.api[module] = entry
    return plan


def _config_inited(app: Sphinx, config) -> None:
    app.sketchopt_plan = plan = build_plan(public_modules())
    config.autosummary_context = {**config.autosummary_context, "api": plan.api}


# ------------------------------------------------------------------------------------------------
# Cross-references to re-exported and private paths.


def _lookup(path: str) -> tuple[bool, Any]:
    """``(True, obj)`` for a dotted path naming an existing object of the package (already
    imported: only ``sys.modules`` is read), else ``(False, None)``."""
    parts = path.split(".")
    if parts[0] != PACKAGE:
        return False, None
    for i in range(len(parts), 0, -1):
        obj = sys.modules.get(".".join(parts[:i]))
        if obj is None:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False, None
        return True, obj
    return False, None


def _unique_owner(target: str) -> list[str]:
    """``[MODULE.target]`` when exactly one object of that name is bound in the package's modules
    (a docstring of a private module's function, documented at a public home); else ``[]``."""
    head = target.split(".")[0]
    owners: dict[int, str] = {}
    for name, module in list(sys.modules.items()):
        if (name == PACKAGE or name.startswith(PACKAGE + ".")) and hasattr(module, head):
            owners.setdefault(id(getattr(module, head)), name)
    return [f"{owner}.{target}" for owner in owners.values()] if len(owners) == 1 else []


def _missing_reference(app: Sphinx, env, node, contnode):
    """Resolve a reference Sphinx did not find: to the home of the object it names (a re-export,
    a private path of a public object, a name imported into the module of the docstring); as
    plain code (no link) when it names an existing object of the package that is not public (a
    private module or function, a constant not in ``__all__``). A name that exists nowhere is
    left to Sphinx, which warns."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").removeprefix("~").removeprefix(".")
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = []
    if module and cls:
        candidates.append(f"{module}.{cls}.{target}")
        found, owner = _lookup(f"{module}.{cls}")
        if found and isinstance(getattr(owner, "__module__", None), str):
            # A docstring names things as its defining module sees them (a private one's).
            candidates.append(f"{owner.__module__}.{target}")
    if module:
        candidates.append(f"{module}.{target}")
    candidates += [target, f"{PACKAGE}.{target}", *_unique_owner(target)]
    domain = env.get_domain("py")
    plan = app.sketchopt_plan
    for candidate in candidates:
        found, obj = _lookup(candidate)
        if not found:
            continue
        if isinstance(obj, types.ModuleType):
            home, reftype = (obj.__name__, "mod") if obj.__name__ in plan.modules else (None, None)
        else:
            home = plan.aliases.get(candidate) or plan.homes.get(id(obj))
            reftype = node["reftype"]
        if home is None:
            return contnode  # an existing object that is not public: code, not a link
        new = node.deepcopy()
        new["reftarget"] = home
        return domain.resolve_xref(env, node["refdoc"], app.builder, reftype, home, new, contnode)
    return None


# ------------------------------------------------------------------------------------------------
# Code spans as cross-references.

#: A code span the pages link: a dotted path into the package, ``()`` allowed after it.
CODE_PATH = re.compile(r"(sketchopt(?:\.[A-Za-z_]\w*)+)(?:\(\))?")
#: Sources whose code spans are linked: the Markdown pages and the notebooks (not the docstrings,
#: which use Sphinx's roles).
LINKED_SUFFIXES = (".md", ".ipynb")


class CodeSpanReferences(SphinxTransform):
    """A code span naming a path of the package (`` `sketchopt.ada_fd` ``) becomes a Python
    cross-reference, as ``{py:obj}`` would make it: see the module docstring."""

    default_priority = 500  # after the parser's own transforms, before anything resolves

    def apply(self, **kwargs: Any) -> None:
        if not str(self.env.doc2path(self.env.docname)).endswith(LINKED_SUFFIXES):
            return
        self._links_through_the_notebooks_folder()
        history = self.env.docname in HISTORY_DOCS
        for node in list(self.document.findall(nodes.literal)):
            match = CODE_PATH.fullmatch(node.astext())
            if match is None:
                continue
            target = match.group(1)
            if history and not _lookup(target)[0]:
                continue  # a name of an old release, gone since
            if any(isinstance(a, _NOT_LINKED) for a in _ancestors(node)):
                if not _lookup(target)[0]:  # a title or a link's text: checked, not linked
                    logger.warning(
                        f"code span {target!r} names nothing in the package",
                        location=node,
                        type="sketchopt",
                        subtype="code-span",
                    )
                continue
            xref = addnodes.pending_xref(
                "",
                refdomain="py",
                reftype="obj",
                reftarget=target,
                refexplicit=True,  # the text stays as written
                refwarn=True,  # unresolved warns even without nitpicky
                refdoc=self.env.docname,
            )
            xref["py:module"] = xref["py:class"] = None
            node["classes"] += ["xref", "py", "py-obj"]
            node.replace_self(xref)
            xref += node


    def _links_through_the_notebooks_folder(self) -> None:
        """A Markdown link to a page by its real path (``../notebooks/quickstart.ipynb``, which
        GitHub follows, where ``docs/notebooks`` is a link to that folder) as a link to the page
        Sphinx knows by the linked folder (``notebooks/quickstart``)."""
        real = self.env.temp_data.get("sketchopt_real_docs")
        if real is None:
            real = {
                os.path.realpath(self.env.doc2path(name)): name for name in self.env.found_docs
            }
            self.env.temp_data["sketchopt_real_docs"] = real
        for node in list(self.document.findall(addnodes.download_reference)) + [
            node
            for node in self.document.findall(addnodes.pending_xref)
            if node.get("refdomain") == "doc" and node["reftarget"] not in self.env.found_docs
        ]:
            if node.get("reftype") != "myst":
                continue
            path = node["reftarget"]  # MyST's absolute real path, or a link's relative one
            if not os.path.isabs(path):
                path = os.path.join(os.path.dirname(self.env.doc2path(self.env.docname)), path)
            paths = [path] + [f"{path}{suffix}" for suffix in LINKED_SUFFIXES]
            docname = next((real[p] for p in map(os.path.realpath, paths) if p in real), None)
            if docname is None:
                continue
            xref = addnodes.pending_xref(
                "",
                *node.children,
                refdomain="doc",
                reftype="myst",
                reftarget=docname,
                reftargetid=None,
                refdoc=self.env.docname,
                refexplicit=node.get("refexplicit", True),
            )
            for child in xref.findall(nodes.inline):
                child["classes"] = [c for c in child["classes"] if c != "download"]
            node.replace_self(xref)


#: Pages that name the objects of past releases (the changelog): a code span naming an object
#: that no longer exists stays code there, since it is history rather than a typo.
HISTORY_DOCS = ("changelog",)

#: Where a code span is not turned into a link: inside one already, in a title (the tables of
#: contents repeat it), in a literal block.
_NOT_LINKED = (nodes.reference, addnodes.pending_xref, nodes.title, nodes.FixedTextElement)


def _ancestors(node):
    while node.parent is not None:
        node = node.parent
        yield node


# ------------------------------------------------------------------------------------------------
# The check: every public module and every public name is in the reference.


def _check_reference(app: Sphinx, env) -> None:
    domain = env.get_domain("py")
    objects, documented_modules = domain.objects, domain.modules
    plan = app.sketchopt_plan
    # Every re-export path is an alias of its home's entry: it resolves as a cross-reference and
    # is in objects.inv (as Python's domain keeps a documented ``:canonical:`` name).
    for path, home in plan.aliases.items():
        if home in objects and path not in objects:
            entry = objects[home]
            objects[path] = ObjectEntry(entry.docname, entry.node_id, entry.objtype, aliased=True)
    reported: set[str] = set()
    for module in plan.modules:
        if module not in documented_modules:
            logger.warning(
                f"public module {module} is missing from the API reference (docs/api/index.md)",
                type="sketchopt",
                subtype="api",
            )
            continue
        entry = plan.api[module]
        homes = [f"{module}.{n}" for n in entry["functions"] + entry["classes"]]
        homes += [f"{module}.{n}" for n, _ in entry["data"]]
        homes += [target for _, rows in entry["reexported"] for _, target in rows]
        for path in dict.fromkeys(homes):
            if path not in objects and path not in reported:
                reported.add(path)
                logger.warning(
                    f"public name {path} is missing from the API reference",
                    type="sketchopt",
                    subtype="api",
                )


def _signature_aliases(app, what, name, obj, options, signature, return_annotation):
    """Optax's ``ScalarOrSchedule`` by its name in signatures, not its 150-character expansion.
    (``autodoc_type_aliases`` would do it but renders ``ScalarOrSchedule | None`` as a
    ``TypeAliasForwardRef`` in Sphinx 9.)"""
    if signature is None:
        return None
    import optax
    from sphinx.util.typing import stringify_annotation

    expanded = stringify_annotation(optax.ScalarOrSchedule, "smart")
    if expanded not in signature:
        return None
    return signature.replace(expanded, "~optax.ScalarOrSchedule"), return_annotation


def _skip_member(app, what, name, obj, skip, options):
    """Skip a ``NamedTuple``'s field accessors ("Alias for field number N"): the class's
    signature and its docstring's Attributes already say what each field holds."""
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


# ------------------------------------------------------------------------------------------------
# The experiments' tables.

HOW_TO = (
    "The results are not part of this build. Run `make run` (`python experiments/run.py all "
    "--out results`, some 40 minutes on a 2-core CPU; `--quick` for a reduced size), then "
    "`make docs`; or point `SKETCHOPT_RESULTS` at a folder `experiments/run.py` wrote."
)


class ResultsTable(SphinxDirective):
    """``results-table NAME``: see the module docstring."""

    required_arguments = 1
    has_content = False
    option_spec = {"claims": directives.flag, "figure": directives.flag}

    def run(self) -> list[nodes.Node]:
        from experiments import common, run  # the repository root is on sys.path (conf.py)

        name = self.arguments[0]
        if name not in ("reproductions", "claims", *run.EXPERIMENTS):
            logger.warning(
                f"results-table: unknown table {name!r}; choose reproductions, claims or one of "
                f"{', '.join(run.EXPERIMENTS)}",
                location=self.get_location(),
                type="sketchopt",
                subtype="results",
            )
            return []
        out = pathlib.Path(self.config.sketchopt_results_dir)
        # Rebuild the page when the results change.
        for path in [*out.glob("*.json"), out / "summary.md"]:
            if path.exists():
                self.env.note_dependency(str(path.resolve()))
        lines: list[str] = []
        if name == "reproductions":
            table = common.reproductions_table(out, run.EXPERIMENTS, only=run.HEADLINE)
            lines += [table] if table else []
        elif name == "claims":
            table = common.reproductions_table(out, run.EXPERIMENTS)
            lines += [table] if table else []
        else:
            lines += self._experiment(out, name, common)
        if not lines:
            missing = "" if name in ("reproductions", "claims") else f" `{name}.json`"
            shown = self.env.temp_data.setdefault("sketchopt_how_to_shown", [])
            if shown:  # said once per page, in full
                lines = [f"*Not generated: no results{missing} in `{self._shown(out)}`.*"]
            else:
                shown.append(True)
                lines = [
                    ":::{admonition} Results not generated",
                    ":class: note",
                    f"No results{missing} in `{self._shown(out)}`. {HOW_TO}",
                    ":::",
                ]
        lines = [_flags_as_code(line) for line in lines]
        container = nodes.container(classes=["sketchopt-results"])
        self.state.nested_parse(
            StringList("\n".join(lines).splitlines(), source=self.get_source_info()[0]),
            self.content_offset,
            container,
        )
        return [container]

    def _shown(self, out: pathlib.Path) -> str:
        """``out`` relative to the repository when it is inside it (``results``)."""
        try:
            shown = os.path.relpath(out, pathlib.Path(self.env.srcdir).parent)
        except ValueError:  # another drive
            return str(out)
        return str(out) if shown.startswith("..") else shown

    def _experiment(self, out: pathlib.Path, name: str, common) -> list[str]:
        path = out / f"{name}.json"
        if not path.exists():
            return []
        payload = json.loads(path.read_text())
        table = payload.get("table") or _summary_section(out / "summary.md", name)
        size = payload.get("size", "?")
        seed = f", seed {payload['seed']}" if "seed" in payload else ""
        lines = [f"*{payload.get('paper', name)}: {size} size{seed} (`{name}.json`).*", ""]
        if table:
            lines += [table, ""]
        else:
            lines += [
                f"*`{name}.json` holds no table (written before the JSON kept it, and "
                f"`summary.md` has no `{name}` section): run `make run` again.*",
                "",
            ]
        if "claims" in self.options and payload.get("claims"):
            lines += [common.claims_markdown(payload["claims"], size_of={name: size}), ""]
        if "figure" in self.options and (out / f"{name}.png").exists():
            docdir = pathlib.Path(self.env.doc2path(self.env.docname)).parent
            rel = os.path.relpath((out / f"{name}.png").resolve(), docdir)
            lines += [f"```{{image}} {rel}", f":alt: {name}", "```", ""]
        return lines


FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")


def _flags_as_code(line: str) -> str:
    """Command-line flags outside code spans as code (``VW --OjaNewton``), so that Sphinx's smart
    quotes do not make their ``--`` a dash."""
    parts = line.split("`")
    parts[::2] = [FLAG.sub(r"`\1`", part) for part in parts[::2]]
    return "`".join(parts)


def _summary_section(summary: pathlib.Path, name: str) -> str | None:
    """The table of ``## NAME (...)`` in ``summary.md`` (its lines that are table rows)."""
    if not summary.exists():
        return None
    text = summary.read_text()
    match = re.search(rf"^## {re.escape(name)}\b.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not match:
        return None
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")]
    return "\n".join(rows) or None


# The papers' abbreviations, which end no sentence: autosummary's one-line summaries would stop
# at "(Ada-FD eq." otherwise (it knows "e.g.", "i.e.", "et al." and "vs." only).
ABBREVIATIONS = tuple(
    f"{lead}{word}."
    for word in ("eq", "eqs", "Eq", "sec", "secs", "Sec", "Fig", "Figs", "fig", "Alg", "Algs")
    + ("alg", "Thm", "Cor", "Prop", "cf", "approx", "resp", "Tab")
    for lead in (" ", "(")
)


def _extract_summary(doc, settings) -> str:
    """autosummary's one-line summary, its first sentence, cut at a period that is neither an
    abbreviation (:data:`ABBREVIATIONS`) nor inside inline markup (``|w . x|``): autosummary
    9.0's own check of the markup parses the whole paragraph instead of the cut."""
    from sphinx.ext import autosummary

    stanza: list[str] = []
    for line in doc:
        if line.strip():
            stanza.append(line.strip())
        elif stanza:
            break
    if not stanza:
        return ""
    if not isinstance(autosummary._parse_summary(stanza, settings)[0], nodes.paragraph):
        return _ORIGINAL_EXTRACT_SUMMARY(doc, settings)
    text = " ".join(stanza)
    pieces = autosummary.periods_re.split(text)
    for i in range(1, len(pieces)):
        summary = ". ".join(pieces[:i]).rstrip(".") + "."
        if summary.endswith(autosummary.WELL_KNOWN_ABBREVIATIONS + ABBREVIATIONS):
            continue
        parsed = autosummary._parse_summary([summary], settings)
        if not any(parsed.findall(nodes.system_message)) and not any(
            parsed.findall(nodes.problematic)
        ):
            return autosummary.literal_re.sub(".", summary)
    return autosummary.literal_re.sub(".", text)


_ORIGINAL_EXTRACT_SUMMARY = None


def setup(app: Sphinx) -> dict[str, Any]:
    global _ORIGINAL_EXTRACT_SUMMARY
    from sphinx.ext import autosummary

    if _ORIGINAL_EXTRACT_SUMMARY is None:
        _ORIGINAL_EXTRACT_SUMMARY = autosummary.extract_summary
        autosummary.extract_summary = _extract_summary
    app.add_config_value("sketchopt_results_dir", "results", "env", types=frozenset({str}))
    app.connect("config-inited", _config_inited)
    app.connect("missing-reference", _missing_reference)
    app.connect("env-check-consistency", _check_reference)
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("autodoc-process-signature", _signature_aliases)
    app.add_directive("results-table", ResultsTable)
    app.add_transform(CodeSpanReferences)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
