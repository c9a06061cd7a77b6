"""Sphinx configuration of sketchopt's documentation site (``make docs``).

Built offline: every page comes from this repository (MyST markdown, the executed notebooks, the
docstrings, the experiments' JSON); nothing is fetched at build time (no intersphinx), so types of
other packages in signatures cannot resolve and are listed in ``nitpick_ignore_regex`` below.
``make docs`` runs ``sphinx-build -W`` (every warning fails the build) with ``nitpicky = True``
(every unresolved cross-reference warns).

The site's own extension is ``docs/_ext/sketchopt_docs.py``: the API reference's member lists
(from each public module's ``__all__``), the check that every public name is in the reference,
re-exported names resolved to their documented home, and the ``results-table`` directive.
"""

from __future__ import annotations

import os
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(REPO))  # sketchopt and experiments/, from this checkout
sys.path.insert(0, str(DOCS / "_ext"))
# The doctest builder runs the guides' examples on the CPU, like the test suite, with 8 simulated
# devices for the many-devices guide (as tests/test_sharding.py has them); set before JAX loads.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()
# The streams guide runs the command line, whose compilation cache would otherwise be the
# user's (~/.cache/sketchopt/jax): the build's own folder instead.
os.environ.setdefault("SKETCHOPT_JAX_CACHE_DIR", str(REPO / "build" / "docs-jax-cache"))

import sketchopt  # noqa: E402

project = "sketchopt"
author = "the sketchopt authors"
copyright = "the sketchopt authors; Apache-2.0"  # noqa: A001 - Sphinx's name
release = sketchopt.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_nb",  # MyST markdown pages and the notebooks (includes myst_parser)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",  # the docstrings are Google style (Args/Returns/References/Examples)
    "sphinx.ext.mathjax",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "sketchopt_docs",  # docs/_ext/sketchopt_docs.py
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = [
    "_build",
    "**.ipynb_checkpoints",
    "_templates",
    "sparse_second_order_check.py",
]

# Every cross-reference must resolve (make docs runs with -W: a broken one fails the build).
nitpicky = True
# Types of other packages, which cannot resolve offline (no intersphinx inventories are fetched):
# JAX, Optax, NumPy, Chex, Flax, Orbax, SciPy, scikit-learn, tqdm, and the standard library's
# typing names as autodoc writes them in signatures. Nothing of sketchopt's own is listed here:
# every sketchopt name must resolve (re-exports are mapped to their documented home by the
# extension, private ones to the public name they are re-exported as).
_EXTERNAL = "jax|jaxlib|optax|numpy|np|jnp|chex|flax|nnx|orbax|ocp|scipy|sklearn|tqdm"
_STDLIB = "typing|collections|abc|dataclasses|enum|pathlib|os|io|argparse|types|functools"
_TYPE_NAMES = (
    # JAX, Optax and NumPy types as their modules re-export them (short names in signatures).
    "Array|ArrayLike|DTypeLike|PRNGKeyArray|Sharding|NamedSharding|PartitionSpec|Mesh"
    "|ShapeDtypeStruct|GradientTransformation\\w*|Params|Updates|OptState|Schedule"
    "|ScalarOrSchedule|PyTree|ndarray|dtype|DType|csr_matrix|spmatrix"
    # typing and collections.abc.
    "|Any|Callable|Sequence|Mapping|Iterable|Iterator|NamedTuple|Literal|Union|Optional|TypeVar"
    "|Protocol|Hashable|Generator|MutableMapping|Self|Path"
    # Built-in types and constants.
    "|int|float|complex|bool|str|bytes|tuple|list|dict|set|frozenset|object|type|None|Ellipsis"
    "|NotImplemented|slice|range|callable|iterable|sequence|mapping|optional"
)
nitpick_ignore_regex = [
    (r"py:.*", rf"({_EXTERNAL}|{_STDLIB})(\..*)?"),
    (r"py:.*", rf"({_TYPE_NAMES})"),
    (r"py:.*", r"\w*(Error|Exception|Warning)"),  # the built-in exceptions
]

# --- MyST and MyST-NB -----------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath", "deflist", "fieldlist"]
myst_heading_anchors = 3
# The notebooks (notebooks/*.ipynb, reached through the docs/notebooks symlink) are committed
# executed (make test runs them with nbmake): the site shows their stored outputs, never re-runs.
nb_execution_mode = "off"
nb_merge_streams = True

# --- API reference ------------------------------------------------------------------------------
autosummary_generate = True
autosummary_generate_overwrite = True
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
# Long signatures one parameter per line.
maximum_signature_line_length = 90
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_custom_sections = [("References", "notes_style")]
napoleon_attr_annotations = False  # the class signature shows the fields' types already
add_module_names = False
python_display_short_literal_types = True

# --- doctest --------------------------------------------------------------------------------------
# The guides' examples are ```{doctest} blocks, run by `sphinx-build -b doctest` (make docs). The
# docstrings' own >>> examples are plain doctest blocks: make test runs them already
# (pytest --doctest-modules), so they are not run a second time here.
doctest_test_doctest_blocks = ""
doctest_global_setup = """
import jax  # jax.devices(): 8 CPU devices (above)
import jax.numpy as jnp
import numpy as np
import optax
import sketchopt as so
"""

# --- HTML -----------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"sketchopt {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {"navigation_with_keys": True}
html_last_updated_fmt = None
html_copy_source = False
html_show_sourcelink = False

# --- the extension --------------------------------------------------------------------------------
# Where the results-table directive reads the experiments' JSON (experiments/run.py's --out):
# $SKETCHOPT_RESULTS, else results/ at the repository root. Absent: an admonition says how to
# generate it, and the build still passes.
sketchopt_results_dir = os.environ.get("SKETCHOPT_RESULTS", str(REPO / "results"))
