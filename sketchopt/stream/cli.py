"""The command line: online passes over a LIBSVM/svmlight or Vowpal Wabbit text file, VW-style.

    python -m sketchopt.stream train.svm [--learner NAME] [--loss LOSS] [--bits B] ...
    sketchopt-stream train.vw -q ab --passes 3 ...      (the same, as a console script)

Progressive validation over the training stream (each example predicted before it is learned
from), the test error of the final weights with ``--test``, predictions with ``--predict``,
checkpoints with ``--save``/``--resume`` (Orbax; a resumed run continues bit-identically: the
same state and totals as one run over both files) and a JSON summary with ``--json``. Run with
``--help`` for every flag and its default.

VW's habits:

* **The format** is detected per file (:func:`sketchopt.stream.data.detect_format`: a ``|`` in the
  first example line is VW's text format, anything else svmlight), or forced with ``--format``.
  VW files are hashed into ``2**bits`` (``--bits``/``-b``, default 18, VW's), svmlight files
  keep their own indices unless ``--bits`` asks for hashing.
* **The constant feature** (VW's bias) is on: a slot of its own after the features (index
  ``d``: the weights have ``d + 1`` entries), learned by each learner's own rule like any
  feature (L1 included: none of the learners' papers exempts a coordinate); ``--noconstant``
  turns it off.
* **Test files** are read with the training file's dimension; features it never had (svmlight
  indices beyond it) have no weight and are ignored.
* **Labels** ``-1/1`` or ``0/1``; a training file of two other labels (LIBSVM's ``1/2``, ``2/4``)
  has the smaller as ``-1`` (:func:`sketchopt.stream.examples.binary_classes`), the pair kept
  for its test file and resumes and reported as ``classes`` in the JSON (``null`` otherwise).
* ``-q ab``/``--quadratic ab`` (repeatable) and ``--interactions ab``: VW's quadratic crosses of
  the namespaces starting with ``a`` and ``b`` (VW files only), built inside the compiled step
  from each example's own features (:mod:`sketchopt.stream.crosses`: VW's index of a quadratic
  feature, colliding crosses summed; the layout is ``crossed``); ``--layout flat`` or
  ``padded`` builds the same vectors as the file is read and stores them instead.
* ``--passes N``: ``N`` passes over the training file, the first parsing it and writing the
  chunks to a cache (a temporary directory, removed at the end), the others reading the cache.
  With more than one pass VW's holdout is on: every ``--holdout_period``-th example (default
  10) of each pass is never learned from, and ``holdout_loss``/``holdout_error`` (the last
  pass's) are reported; ``--holdout_off`` learns from every example. VW's early termination is
  not implemented (every pass runs).
* Aliases: ``-b`` (``--bits``), ``-l`` (``--learning-rate``), ``-p`` (``--predict``),
  ``--loss_function`` (``--loss``), ``-i``/``--initial_regressor`` (``--resume``),
  ``-f``/``--final_regressor`` (``--save``), ``-c``/``--cache`` (accepted: the cache is
  automatic with ``--passes``).

Decisions (no VW flag has the same meaning everywhere):

* ``--learning-rate`` is each learner's step-size parameter: ``eta`` of ADA-DIAG, NAG, FOBOS and
  truncated gradient, ``gamma`` of RDA (the weights scale as ``sqrt(t) / gamma``), ``alpha`` of
  FTRL-Proximal. Its default depends on the learner (:data:`DEFAULT_LEARNING_RATE`);
  ``ada_diag``'s is VW default's normalized rate, ``0.5 / sqrt(N)`` for the training file's
  mean normalized squared norm ``N`` (:func:`_normalized_rate`), and FTRL-Proximal's
  ``alpha = 0.5`` errs as VW ``--ftrl``: both within a point of VW on files as downloaded.
* ``--l1`` is the L1 strength of every learner (truncated gradient's gravity); ``--l2`` exists
  for FTRL-Proximal only (the others reject a non-zero ``--l2``).
* ``--resume DIR`` takes the learner, its hyperparameters, the loss, ``--bits``, the dimension
  and the chunk layout (flat with its segment width, or padded with its width) from the
  checkpoint (those flags are ignored then), so that the resumed half computes exactly as one
  run would; a ``--learner``, ``--loss`` or ``--bits`` other than the checkpoint's is an error.
* ``--predict FILE`` writes the raw score ``w . x`` of each test example, one per line (VW's
  ``-p`` without a link function); ``--link logistic`` writes its sigmoid instead (VW's
  ``--link=logistic``: the probability of ``+1`` under the logistic loss).
* ``-d FILE`` (VW's) names the training file as the positional argument does; ``-c`` and
  ``-k`` are accepted (the cache of ``--passes`` is automatic and never kept).
* ``-t``/``--testonly`` with ``-i DIR`` (VW's test-only run): the positional file is scored with
  the checkpoint's weights and read as its test file would be (dimension, index base, classes,
  crosses); nothing is learned, so ``--test``, ``--save`` and ``--passes`` are refused. The JSON
  then has ``test_error``, ``test_loss``, ``test_examples`` and ``examples_per_second`` (of the
  scoring), no progressive figures.
* The second-order learners (:mod:`sketchopt.stream.second_order`): ``--sketch-size`` is ``m``
  (default 10; ``oja_son``'s at most the dimension, constant included);
  ``--diagonal-rescaling`` is SON's sec. 5.2 in VW's form (``--normalize``: the learner fed
  ``x / D^{1/2}``, ``D`` grown by each example's own gradient before it learns), on by default
  for ``oja_son``, ``fd_son`` and ``rp_son`` with VW's ``--OjaNewton`` constants
  (:mod:`sketchopt.stream.second_order`, "Diagonal rescaling" and "Defaults"), off for
  ``rfd_son``; ``--no-diagonal-rescaling`` turns it off. ``--alpha`` is SON's ridge (``alpha`` of
  ``oja_son``, ``fd_son``, ``rp_son``, default: 0.5 with the rescaling, else 1/16 of the running
  mean of ``|x|^2``; ``alpha0`` of ``rfd_son``, default 0: RFD0-SON); ``--learning-rate`` is
  SON's ``eta_t`` held constant (default: 1/8 with the rescaling, else each learner's schedule,
  ``1/sqrt(t)``, ``1/t`` for ``rfd_son``) and ADA-FD's ``eta``; ``--bound`` is SON's ``C`` of
  the bounded-prediction projection (default: none); ``--delta`` is ADA-FD's ``delta`` (default:
  the root of the running mean of ``|x|^2``; the step outside the sketch is ``eta / delta``),
  ``--rule`` and ``--robust`` pick its update and sketch; ``--seed`` draws Oja-SON's initial
  directions and RP-SON's projections. ``--l1``/``--l2`` do not apply to them.
* **Errors** (a missing file or model directory, an empty file, labels outside the loss's
  domain, conflicting flags) are one line on stderr, ``error: ...``, and the exit status 2;
  ``--help`` and argparse's own errors answer without importing JAX (the modules that need it
  are imported inside the functions that run the job).
* **The JSON** (``--json`` and a checkpoint's ``config.json``) is strict: a missing or
  non-finite figure (a loss that overflowed, an infinite ``--bound``) is ``null``, never
  ``NaN`` or ``Infinity``; a resumed run reads a ``null`` bound or threshold as infinite.
  :func:`load_model` reads a ``--save`` directory back: its weights and the run's
  configuration.

VW's outputs and the rest of its flags (:mod:`sketchopt.stream.vw_outputs` writes VW's text):

* ``-p FILE`` (also ``--predictions``, ``--predict``): with ``--test`` (or ``-t``) the test
  file's scores; on a training run without ``--test`` VW's progressive predictions, one per
  example as it is met (predicted before it is learned from; every pass, held-out examples
  included), in the file's order.
* ``-P N``/``--progress N``: VW's progress lines (its header, columns and schedule: an integer
  every ``N`` of example weight, a float ``F`` multiplicatively), printed on stderr as the run
  goes, in place of the progress bar and of the report's table; ``--quiet`` silences them.
  With ``--passes`` > 1 they cover every scored example of every pass (VW prints the holdout
  loss, marked ``h``, after the first pass).
* ``--readable_model FILE`` and ``--invert_hash FILE``: VW's text of the final weights (of the
  checkpoint's with ``-t -i``), ``--invert_hash`` naming each by the input's feature names
  (VW's ``namespace^feature`` and ``a*b`` crosses, a LIBSVM file's own indices, ``Constant``);
  the format, VW 9's ``--predict_only_model`` form, is described in
  :mod:`sketchopt.stream.vw_outputs`.
* ``--binary`` (VW's): the predictions of ``-p`` and of the progress lines are the sign of the
  score (``-1``/``1``), the progress lines' losses the 0/1 loss; learning is unchanged (VW's
  ``--binary`` too only maps the output), so are the JSON's figures (its ``progressive_error``
  is that 0/1 loss). Not with ``--link logistic``.
* ``--random_seed N`` is ``--seed N``: the state of ``oja_son`` (its initial directions) and
  ``rp_son`` (its projections), the only randomness of a run: the first-order learners, the
  reading, the hashing and the order of the examples (never shuffled) are deterministic.
* VW's flags with no exact equivalent here (:data:`VW_ONLY`): ``--save_resume`` is accepted
  (always on: ``--save`` keeps the whole state, ``-i`` continues bit-identically),
  ``--power_t 0.5`` and ``--initial_t 0`` (VW's defaults) are accepted as what ``ada_diag``
  does, other values refused; ``--OjaNewton`` and ``--ftrl`` are refused with their
  equivalents (``--learner oja_son``, ``--learner ftrl``: not VW's code, so not VW's numbers).
  ``--l2`` outside ``ftrl`` is refused (no other learner has an L2 term).
* **The compilation cache**: JAX's persistent compilation cache is on for the command line
  (only: importing the library never switches it on), in ``$SKETCHOPT_JAX_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/sketchopt/jax``, else ``~/.cache/sketchopt/jax``, every program kept (JAX's
  minimum compile time and entry size set to 0), so that a repeated run compiles nothing; where
  JAX's own cache folder is set (``JAX_COMPILATION_CACHE_DIR``, ``jax_compilation_cache_dir``),
  that cache is used as JAX is configured.
  ``--no-cache`` turns it off for the run. :func:`main` sets it before the run's first compile
  and puts JAX's settings back after it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import itertools
import json
import math
import os
import pathlib
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from sketchopt.stream import runner

# Nothing here imports JAX, NumPy or the package's JAX modules at import time: ``--help`` and
# argparse's errors answer at once, and each function imports what it needs when it runs.

__all__ = [
    "CACHE_ENV",
    "DEFAULT_LEARNING_RATE",
    "DEFAULT_SKETCH_SIZE",
    "VW_ONLY",
    "SavedModel",
    "build_parser",
    "cache_folder",
    "compilation_cache",
    "load_model",
    "main",
    "run",
]

#: The second-order learners' ``m`` when ``--sketch-size`` is not given (VW ``--OjaNewton``'s);
#: ``oja_son``'s is at most the dimension.
DEFAULT_SKETCH_SIZE = 10

#: ``--learning-rate`` when not given, per learner. ``ada_diag``'s is this over
#: ``sqrt(N)``, ``N`` the training file's mean normalized squared norm (:func:`_normalized_rate`).
DEFAULT_LEARNING_RATE = {
    "ada_diag": 0.5,
    "fobos": 0.1,
    "truncated_gradient": 0.1,
    "rda": 1.0,
    "ftrl": 0.5,
    "nag": 0.5,
    "ada_fd": 0.5,
}

_CONFIG = "config.json"
_STATE = "state"

# The parser's choices and the defaults its help quotes, written out so that building it imports
# no JAX module; ``tests/test_stream_cli.py`` checks them against sketchopt.stream.learners'
# ``LEARNERS``, ``SECOND_ORDER_NAMES`` and ``LOSSES`` and sketchopt.stream.second_order's.
_FIRST_ORDER_NAMES = ("ada_diag", "fobos", "truncated_gradient", "rda", "ftrl", "nag")
_SECOND_ORDER_NAMES = ("oja_son", "fd_son", "rfd_son", "rp_son", "ada_fd")
_LOSS_NAMES = ("hinge", "logistic", "squared", "squared_hinge")
_NORMALIZED_ALPHA = 0.5  # second_order.NORMALIZED_ALPHA
_ALPHA_SCALE = 1 / 16  # second_order.ALPHA_SCALE
_DELTA_SCALE = 1.0  # second_order.DELTA_SCALE

#: The program's name when it is not run from a command line of its own (``main(argv)``).
_PROG = "sketchopt-stream"


class _VwOnly(NamedTuple):
    """One of VW's flags with no exact equivalent here: ``takes`` a value or not, the values
    ``accepted`` as they are (``None``: any, ``()``: none, refused), and what it means here."""

    takes: bool
    accepted: tuple[float, ...] | None
    meaning: str


#: VW's flags accepted with VW's meaning only where a learner here has it exactly, else refused
#: with the equivalent (the module docstring; ``--help`` quotes each ``meaning``).
VW_ONLY = {
    "--save_resume": _VwOnly(
        False, None, "always on: --save keeps the whole state, -i continues bit-identically"
    ),
    "--power_t": _VwOnly(
        True, (0.5,), "0.5 only (VW's default): ada_diag's step is eta / sqrt(sum of g^2); "
        "no learner here has another power",
    ),
    "--initial_t": _VwOnly(
        True, (0.0,), "0 only (VW's default): the learners' sums start at 0 (ada_diag's "
        "floor is --delta); no learner here has another initial t",
    ),
    "--OjaNewton": _VwOnly(
        False, (), "refused: use --learner oja_son (its defaults are VW's --OjaNewton "
        "constants; not VW's code)",
    ),
    "--ftrl": _VwOnly(
        False, (), "refused: use --learner ftrl (FTRL-Proximal: --learning-rate is alpha, "
        "--beta, --l1, --l2; not VW's code or defaults)",
    ),
}  # fmt: skip

#: The environment variable naming the command line's JAX compilation cache folder.
CACHE_ENV = "SKETCHOPT_JAX_CACHE_DIR"


def _prog(argv=None) -> str:
    """The program's name as the user called it: ``python -m sketchopt.stream`` when run as a
    module, the console script's name (``sketchopt-stream``) when run as one; ``main(argv)``
    called from Python is ``sketchopt-stream``."""
    called = sys.argv[0] if sys.argv else ""
    if os.path.basename(called) == "__main__.py":  # python -m sketchopt.stream
        return f"{os.path.basename(sys.executable) or 'python'} -m sketchopt.stream"
    if argv is None and called not in ("", "-c", "-m"):
        return os.path.basename(called)
    return _PROG


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser (``prog``: the name its usage line gives; default
    :func:`_prog`'s). Building it imports no JAX module."""
    parser = argparse.ArgumentParser(
        prog=_prog() if prog is None else prog,
        description="One online pass of a sparse linear learner over a LIBSVM/svmlight file, "
        "with progressive validation (sketchopt.stream).",
    )
    _add_inputs(parser)
    _add_hyperparameters(parser)
    _add_outputs(parser)
    return parser


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    """The data and the learner: ``train``, ``--learner``, ``--loss``, ``--bits``."""
    parser.add_argument(
        "train",
        type=pathlib.Path,
        nargs="?",
        help="training examples (svmlight or VW text format; or -d FILE, VW's way)",
    )
    parser.add_argument(
        "-d", "--data", type=pathlib.Path, help="VW's -d: the training file, as the positional"
    )
    parser.add_argument(
        "--format",
        choices=("auto", "svmlight", "vw"),
        default="auto",
        help="the files' format (default auto: VW's when the first example line holds a '|')",
    )
    names = list(_FIRST_ORDER_NAMES) + list(_SECOND_ORDER_NAMES)
    parser.add_argument(
        "--learner", default=None, choices=names, help="the learner (default: ada_diag)"
    )
    parser.add_argument(
        "--loss",
        "--loss_function",
        default=None,
        choices=_LOSS_NAMES,
        help="the loss (default: logistic; labels {-1, +1}, {0, 1} or any two others, the "
        "smaller -1, for the classification losses)",
    )
    parser.add_argument(
        "-b",
        "--bits",
        type=int,
        default=None,
        help="weights of dimension 2^B, indices hashed into it when the data's are larger "
        "(default: the data's own dimension; VW files: 18)",
    )
    parser.add_argument(
        "--noconstant",
        action="store_true",
        help="no constant feature (default: VW's constant, a bias learned like any feature)",
    )
    parser.add_argument(
        "-q",
        "--quadratic",
        action="append",
        default=[],
        metavar="AB",
        help="cross the namespaces starting with A and B (VW files; repeatable)",
    )
    parser.add_argument(
        "--interactions",
        action="append",
        default=[],
        metavar="AB",
        help="VW's --interactions, two namespaces only: the same as -q AB",
    )
    parser.add_argument(
        "--passes", type=int, default=1, help="passes over the training file (default 1)"
    )
    parser.add_argument(
        "--holdout_off", action="store_true", help="with --passes > 1: learn from every example"
    )
    parser.add_argument(
        "--holdout_period",
        type=int,
        default=10,
        help="with --passes > 1: hold out every k-th example of each pass (default 10, VW's)",
    )
    parser.add_argument(
        "-c", "--cache", action="store_true", help="accepted (the cache is automatic)"
    )
    parser.add_argument(
        "-k", "--kill_cache", action="store_true", help="accepted (the cache is never kept)"
    )


def _add_hyperparameters(parser: argparse.ArgumentParser) -> None:
    """The learners' hyperparameters, ``--sketch-size`` to ``--period``."""
    parser.add_argument(
        "--sketch-size",
        type=int,
        default=None,
        help=f"second-order learners' m (default: {DEFAULT_SKETCH_SIZE}, VW --OjaNewton's; for "
        "oja_son at most the dimension, its m orthonormal directions need m <= d)",
    )
    parser.add_argument(
        "-l",
        "--learning-rate",
        "--learning_rate",
        type=float,
        default=None,
        help="the learner's step-size parameter: eta (ada_diag, nag, fobos, truncated_gradient), "
        "gamma (rda), alpha (ftrl) (default per learner: "
        + ", ".join(
            f"{k} {v:g}" + ("/sqrt(N), N the examples' mean normalized |x|^2" * (k == "ada_diag"))
            for k, v in DEFAULT_LEARNING_RATE.items()
        )
        + ")",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="SON's ridge: alpha (oja_son, fd_son, rp_son; default auto: "
        f"{_NORMALIZED_ALPHA:g} in rescaled coordinates, else "
        f"{_ALPHA_SCALE:g} x the running mean of |x|^2), "
        "alpha0 (rfd_son; default 0)",
    )
    parser.add_argument(
        "--delta",
        type=float,
        default=None,
        help="delta of ada_diag (default 1e-6) and of ada_fd (default auto: "
        f"{_DELTA_SCALE:g} x the root of the running mean of |x|^2, scale-free)",
    )
    parser.add_argument(
        "--bound", type=float, default=math.inf, help="SON's prediction bound C (default: none)"
    )
    parser.add_argument(
        "--rule",
        choices=("mirror_descent", "dual_averaging"),
        default="mirror_descent",
        help="ada_fd's update (default: mirror_descent)",
    )
    parser.add_argument("--robust", action="store_true", help="ada_fd with the RFD sketch")
    parser.add_argument(
        "--diagonal-rescaling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SON's diagonal rescaling, sec. 5.2, in VW's --normalize form: examples fed as "
        "x / D^(1/2), D grown by each example's gradient before it learns (oja_son, fd_son, "
        "rp_son: on by default, with alpha and eta VW's --OjaNewton's; rfd_son: off)",
    )
    parser.add_argument(
        "--seed",
        "--random_seed",
        type=int,
        default=0,
        help="the run's only randomness, oja_son's initial directions and rp_son's projections "
        "(default 0; VW's --random_seed: nothing else is random, nothing is shuffled)",
    )
    parser.add_argument("--beta", type=float, default=1.0, help="FTRL-Proximal's beta (default: 1)")
    parser.add_argument(
        "--l1", type=float, default=0.0, help="L1 strength (truncated gradient: gravity; default 0)"
    )
    parser.add_argument(
        "--l2",
        type=float,
        default=0.0,
        help="L2 strength, ftrl only (default 0; VW's --l2 with another learner is refused: "
        "none of the others has an L2 term)",
    )
    parser.add_argument(
        "--theta",
        type=float,
        default=math.inf,
        help="truncated gradient's threshold (default: inf)",
    )
    parser.add_argument(
        "--period", type=int, default=1, help="truncated gradient's period K (default: 1)"
    )


def _add_outputs(parser: argparse.ArgumentParser) -> None:
    """Evaluation, predictions, checkpoints, the report and the run's layout."""
    parser.add_argument("--test", type=pathlib.Path, help="test examples: report test_error")
    parser.add_argument(
        "-p",
        "--predict",
        "--predictions",
        type=pathlib.Path,
        help="write one score per line: of each test example with --test or -t, else VW's "
        "progressive predictions of the training run (each example before it is learned from)",
    )
    parser.add_argument(
        "--link",
        choices=("identity", "logistic"),
        default="identity",
        help="VW's --link for -p: the raw score w.x (default) or its sigmoid, the probability "
        "of +1 under the logistic loss",
    )
    parser.add_argument(
        "-f",
        "--final_regressor",
        "--save",
        dest="save",
        type=pathlib.Path,
        help="save the state here (Orbax) at the end",
    )
    parser.add_argument(
        "-i",
        "--initial_regressor",
        "--resume",
        dest="resume",
        type=pathlib.Path,
        help="continue from a --save directory",
    )
    parser.add_argument(
        "-t",
        "--testonly",
        action="store_true",
        help="VW's -t: with -i, score the positional file with the saved weights, learning "
        "nothing (its test_error; -p writes its scores)",
    )
    parser.add_argument("--json", type=pathlib.Path, help="write the summary as JSON here")
    parser.add_argument(
        "--chunk-size", type=int, default=4096, help="examples per compiled scan (default 4096)"
    )
    parser.add_argument(
        "--layout",
        choices=("auto", "flat", "padded"),
        default="auto",
        help="flat: each example costs its own length; padded: every example padded to the "
        "longest; auto (default): flat where padding to the longest costs more than the flat "
        "segments' fixed cost (sketchopt.stream.runner.flat_pays), and with -q the crosses "
        "built inside the compiled step (flat or padded with -q: the crosses built as the file "
        "is read and stored)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or report")
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="no persistent compilation cache (default: JAX's, in $SKETCHOPT_JAX_CACHE_DIR or "
        "the user's cache folder, sketchopt/jax: a repeated run compiles nothing)",
    )
    _add_vw_outputs(parser)


def _add_vw_outputs(parser: argparse.ArgumentParser) -> None:
    """VW's text outputs and the VW flags of :data:`VW_ONLY`."""
    parser.add_argument(
        "-P",
        "--progress",
        metavar="N",
        help="VW's progress lines on stderr: every N of example weight (an integer), or at "
        "example weights growing by a factor N (a float, VW's default 2.0)",
    )
    parser.add_argument(
        "--readable_model", type=pathlib.Path, help="VW's text of the final weights, index:weight"
    )
    parser.add_argument(
        "--invert_hash",
        type=pathlib.Path,
        help="VW's text of the final weights with the input's feature names, name:index:weight",
    )
    parser.add_argument(
        "--binary",
        action="store_true",
        help="VW's --binary: -p and the progress lines predict the sign, -1 or 1 (learning "
        "unchanged)",
    )
    for flag, vw in VW_ONLY.items():
        kind = {"metavar": "V"} if vw.takes else {"action": "store_const", "const": "on"}
        parser.add_argument(flag, dest=f"vw_{flag[2:]}", help=f"VW's {flag}: {vw.meaning}", **kind)


def _hyperparameters(args) -> dict[str, Any]:
    """The keyword arguments of ``args.learner``'s constructor."""
    name = args.learner
    if name in _SECOND_ORDER_NAMES:
        return _second_order_hyperparameters(args)
    lr = DEFAULT_LEARNING_RATE[name] if args.learning_rate is None else args.learning_rate
    if name == "ada_diag" and args.learning_rate is None:
        lr = _AUTO  # set from the training file's scan (_normalized_rate)
    if args.l2 and name != "ftrl":
        raise ValueError(
            f"--l2 applies to ftrl only, not to {name}: no other learner here has an L2 term "
            "(VW's --l2; the equivalent is --learner ftrl --l2 X, FTRL-Proximal's)"
        )
    if name == "ada_diag":
        delta = 1e-6 if args.delta is None else args.delta
        return {"learning_rate": lr, "delta": delta, "l1": args.l1}
    if name == "fobos":
        return {"learning_rate": lr, "l1": args.l1}
    if name == "truncated_gradient":
        return {"learning_rate": lr, "gravity": args.l1, "theta": args.theta, "period": args.period}
    if name == "rda":
        return {"learning_rate": lr, "l1": args.l1}
    if name == "nag":
        if args.l1:
            raise ValueError("--l1 does not apply to nag")
        return {"learning_rate": lr}
    return {"learning_rate": lr, "beta": args.beta, "l1": args.l1, "l2": args.l2}


def _second_order_hyperparameters(args) -> dict[str, Any]:
    """The keyword arguments of a second-order learner (module docstring)."""
    from sketchopt.stream import second_order

    name = args.learner
    if args.l1 or args.l2:
        raise ValueError(f"--l1/--l2 do not apply to {name}")
    options: dict[str, Any] = {"sketch_size": args.sketch_size}
    son_only = {"--alpha": args.alpha is not None, "--bound": math.isfinite(args.bound),
                "--diagonal-rescaling": args.diagonal_rescaling is not None}  # fmt: skip
    ada_fd_only = {"--delta": args.delta is not None, "--robust": args.robust,
                   "--rule": args.rule != "mirror_descent"}  # fmt: skip
    other = son_only if name == "ada_fd" else ada_fd_only
    wrong = [flag for flag, given in other.items() if given]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} do(es) not apply to {name}")
    if name == "ada_fd":
        lr = DEFAULT_LEARNING_RATE[name] if args.learning_rate is None else args.learning_rate
        delta = "auto" if args.delta is None else args.delta
        return options | {
            "learning_rate": lr, "delta": delta, "rule": args.rule, "robust": args.robust,
        }  # fmt: skip
    if args.learning_rate is not None:
        options["eta"] = args.learning_rate
    options["bound"] = args.bound
    rescaling = args.diagonal_rescaling
    if rescaling is None:  # the learner's default, written down so that a resumed run keeps it
        make = getattr(second_order, name)
        rescaling = inspect.signature(make).parameters["diagonal_rescaling"].default
    # its form by name ("fed" for on), so that a checkpoint keeps meaning what it did
    options["diagonal_rescaling"] = second_order.RESCALINGS[0] if rescaling is True else rescaling
    if name == "rfd_son":
        return options | {"alpha0": 0.0 if args.alpha is None else args.alpha}
    return options | {"alpha": "auto" if args.alpha is None else args.alpha}


def _strict(value):
    """``value`` for strict JSON: a non-finite float (NaN, an infinity) is ``None``, NumPy's
    scalars and arrays Python's numbers and lists."""
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    if hasattr(value, "tolist"):  # a NumPy (or JAX) scalar or array
        return _strict(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _dumps(value) -> str:
    """``value`` as strict JSON (:func:`_strict`: ``null`` for a missing or non-finite figure,
    never ``NaN`` or ``Infinity``)."""
    return json.dumps(_strict(value), indent=1, allow_nan=False)


#: The hyperparameters whose ``null`` in a checkpoint's config is infinite (their default).
_INFINITE_WHEN_NULL = ("bound", "theta")


def _load_config(directory: pathlib.Path) -> dict:
    """A ``--save`` directory's config, its ``null`` figures read back: an infinite ``--bound``
    or ``--theta`` (:data:`_INFINITE_WHEN_NULL`), a non-finite curve figure as NaN (a loss sum
    past an overflow: ``inf - inf`` and ``nan`` give the next line the same NaN)."""
    config = json.loads((directory / _CONFIG).read_text())
    hyper = config.get("hyperparameters") or {}
    for key in _INFINITE_WHEN_NULL:
        if key in hyper and hyper[key] is None:
            hyper[key] = math.inf
    config["curve"] = [
        {k: math.nan if v is None else v for k, v in line.items()} for line in config["curve"]
    ]
    return config


def _save(directory: pathlib.Path, config: dict, state, result: runner.StreamResult) -> None:
    import numpy as np
    import orbax.checkpoint as ocp

    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    progress = {k: np.asarray(v) for k, v in result.progress._asdict().items()}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(directory / _STATE, {"state": state, "progress": progress}, force=True)
        checkpointer.wait_until_finished()
    (directory / _CONFIG).write_text(_dumps({**config, "curve": result.curve}))


def _restore(directory: pathlib.Path, learner, dim: int):
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from sketchopt.stream import runner, second_order

    directory = directory.resolve()
    like = jax.eval_shape(lambda: learner.init(dim))
    progress = {k: np.asarray(v) for k, v in runner.Progress.zeros()._asdict().items()}
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            restored = checkpointer.restore(
                directory / _STATE, {"state": like, "progress": progress}
            )
        except ValueError:  # saved before the FD family listed its support: rebuilt from the table
            bare = second_order.without_support(like)
            if bare is None:
                raise
            restored = checkpointer.restore(
                directory / _STATE, {"state": bare, "progress": progress}
            )
            restored["state"] = second_order.with_support(restored["state"], like)
    progress = runner.Progress(**{k: np.asarray(v) for k, v in restored["progress"].items()})
    return restored["state"], progress


def _resolve(args) -> tuple[dict, dict | None]:
    """The run's configuration (learner, loss, hyperparameters, bits, the constant, the
    crosses), from the flags or, with ``--resume``, from the checkpoint (explicit conflicting
    flags are an error)."""
    given = {"learner": args.learner, "loss": args.loss, "bits": args.bits}
    pairs = list(args.quadratic) + list(args.interactions)
    for pair in args.interactions:
        if len(pair) != 2:
            raise ValueError(f"--interactions {pair}: only two namespaces (VW's -q) are supported")
    if args.passes < 1:
        raise ValueError(f"--passes must be at least 1, got {args.passes}")
    if args.holdout_period < 1:
        raise ValueError(f"--holdout_period must be at least 1, got {args.holdout_period}")
    if args.resume is None:
        args.learner = args.learner or "ada_diag"
        config = {"learner": args.learner, "loss": args.loss or "logistic", "bits": args.bits}
        config["hyperparameters"] = _hyperparameters(args)
        config |= {"constant": not args.noconstant, "quadratic": pairs}
        return config, None
    saved = _load_config(args.resume)
    for key, value in given.items():
        if value is not None and value != saved[key]:
            raise ValueError(f"--{key} {value} differs from the checkpoint's {saved[key]}")
    keys = ("learner", "loss", "bits", "hyperparameters", "dim", "layout", "width", "nnz")
    keys += ("zero_based", "format", "constant", "quadratic", "classes")
    return {k: saved.get(k) for k in keys}, saved


def _format(args, path) -> str:
    from sketchopt.stream import data

    return data.detect_format(path) if args.format == "auto" else args.format


def _vw_bits(config) -> int:
    return 18 if config["bits"] is None else int(config["bits"])


_AUTO = "auto"


def _normalized_rate(info, constant: bool) -> float:
    """``ada_diag``'s default rate: :data:`DEFAULT_LEARNING_RATE`'s over ``sqrt(N)``, ``N`` the
    training examples' mean normalized squared norm ``sum_i (x_i / s_i)^2`` (``s_i`` feature
    ``i``'s largest ``|value|`` in the file, :class:`~sketchopt.stream.data.FeatureScales`;
    the constant feature counts 1). VW's default, normalized adaptive (Ross, Mineiro & Langford
    2013, Alg. 2), divides its rate by the running ``sqrt(N / t)``; ADA-DIAG's step moves a
    prediction by about ``eta`` per unit of ``N``, so at VW's ``0.5 / sqrt(N)`` the two move
    predictions alike (on binary features ``N`` is the mean number of non-zeros). Measured on
    the unshuffled agaricus file: 5.59% test errors (VW default 5.09%; ``0.5`` made 9.44%)."""
    norm = float(info.normalized_norm) + (1.0 if constant else 0.0)
    return DEFAULT_LEARNING_RATE["ada_diag"] / math.sqrt(max(norm, 1.0))


def _scan(path, fmt: str, config):
    """The file's scan (every line validated before learning starts); a file without examples
    is an error that names it."""
    from sketchopt.stream import data

    if fmt == "vw":
        info = data.scan_vw(path, quadratic=config["quadratic"])
    elif config["quadratic"]:
        raise ValueError("-q/--interactions cross VW namespaces: they need a VW text file")
    else:
        info = data.scan_svmlight(path, zero_based=config.get("zero_based") or "auto")
    if info.examples == 0:
        raise ValueError(f"{path}: no examples (the file is empty or holds only comments)")
    return info


def _feature_dim(fmt: str, info, config) -> int:
    from sketchopt.stream import data

    if fmt == "vw":
        return 2 ** _vw_bits(config)
    return data.stream_dim(info, bits=config["bits"])


def _crossed(args, config) -> bool:
    """Whether the crosses are built inside the compiled step (``-q`` with ``--layout auto``,
    or a checkpoint of such a run)."""
    if not config["quadratic"]:
        return False
    if config.get("layout") is not None:
        return config["layout"] == "crossed"
    return args.layout == "auto"


def _read(path, fmt, info, config, chunk_size, *, nnz=None, test=False, crossed=False):
    """The file's chunks (padded, or with ``crossed`` the crosses left to the device), with the
    run's constant, crosses and dimension."""
    from sketchopt.stream import data

    if fmt == "vw":
        return data.iter_vw(
            path, chunk_size=chunk_size, bits=_vw_bits(config), quadratic=config["quadratic"],
            loss=config["loss"], constant=config["constant"], nnz=nnz, info=info,
            crosses="device" if crossed else "host", width=config.get("width"),
            classes=config["classes"],
        )  # fmt: skip
    return data.iter_svmlight(
        path, chunk_size=chunk_size, loss=config["loss"], dim=config["dim"], bits=config["bits"],
        info=info, nnz=nnz, constant=config["constant"], unseen="drop" if test else "error",
        zero_based=config["zero_based"] if test else "auto", classes=config["classes"],
    )  # fmt: skip


def _layout(args, config, chunks, dim):
    """The training chunks in the run's layout. A new run resolves ``--layout auto`` from the
    first chunk and records the layout, the segment width and the padded width in ``config``;
    a resumed run reuses the checkpoint's, so that both halves compute alike, to the bit."""
    from sketchopt.stream import runner
    from sketchopt.stream.crosses import CrossedExamples

    chunks = iter(chunks)
    first = next(chunks, None)
    if first is None:
        return iter(())
    if isinstance(first, CrossedExamples):
        config.update(layout="crossed", width=first.layout.width, nnz=None)
        return itertools.chain([first], chunks)
    if "layout" not in config or config["layout"] is None:
        layout = args.layout
        if layout == "auto":
            layout = "flat" if runner.flat_pays(first, dim) else "padded"
        nnz = int(first.indices.shape[1]) - int(config["constant"])
        config.update(layout=layout, nnz=nnz, width=None)
    chunks = itertools.chain([first], chunks)
    if config["layout"] == "padded":
        return chunks
    flat = runner.as_flat(chunks, dim, config["width"])
    first_flat = next(flat)
    config["width"] = first_flat.width
    return itertools.chain([first_flat], flat)


def _cached(chunks, directory: pathlib.Path):
    """``chunks`` as they are, each written to ``directory`` as it passes (the cache of the
    parsed examples that the later passes read, :func:`_replay`)."""
    import numpy as np

    for i, chunk in enumerate(chunks):
        fields = chunk._asdict()
        layout = fields.pop("layout", None)
        kind = type(chunk).__name__
        arrays = {k: np.asarray(v) for k, v in fields.items() if v is not None}
        if layout is not None:  # the static side of a crossed chunk, restored by _replay
            arrays["layout"] = np.asarray(json.dumps(layout._asdict()))
        np.savez(directory / f"{i:08d}.npz", kind=kind, **arrays)
        yield chunk


def _replay(directory: pathlib.Path):
    """The chunks :func:`_cached` wrote to ``directory``, in their order."""
    import numpy as np

    from sketchopt.stream.crosses import CrossedExamples, CrossLayout
    from sketchopt.stream.examples import FlatExamples, SparseExamples

    kinds = {cls.__name__: cls for cls in (SparseExamples, FlatExamples, CrossedExamples)}
    for path in sorted(directory.glob("*.npz")):
        with np.load(path) as stored:
            arrays = {k: stored[k] for k in stored.files if k != "kind"}
            kind = kinds[str(stored["kind"])]
        if kind is FlatExamples:
            arrays["width"] = int(arrays["width"])
        if kind is CrossedExamples:
            layout = json.loads(str(arrays["layout"]))
            arrays["layout"] = CrossLayout(**{**layout, "square": tuple(layout["square"])})
        yield kind(**arrays)


def _passes(args, config, info, fmt, dim, learner, state, start, curve, cache, watch):
    """The training passes; ``cache`` a directory for the parsed chunks when more than one;
    ``watch`` (:class:`_Watch`) sees each chunk and its predictions."""
    import jax

    from sketchopt.stream import runner

    holdout = None if args.passes == 1 or args.holdout_off else args.holdout_period
    nnz = config.get("nnz") if config.get("layout") == "padded" else None
    seconds, result = 0.0, None
    for k in range(args.passes):
        if k == 0:
            chunks = _read(
                args.train, fmt, info, config, args.chunk_size, nnz=nnz,
                crossed=_crossed(args, config),
            )  # fmt: skip
            chunks = _layout(args, config, chunks, dim)
            if args.passes > 1:
                chunks = _cached(chunks, cache)
        else:
            chunks = _replay(cache)
        result = runner.run_stream(
            learner, watch.wrap(chunks), dim, state=state, start=start, curve=curve,
            progress=not args.quiet and args.progress is None, total=info.examples,
            key=jax.random.PRNGKey(args.seed), holdout_period=holdout,
            observe=watch if watch.active else None,
        )  # fmt: skip
        seconds += result.seconds
        state, start, curve = result.state, result.progress, result.curve
    return result, seconds


def _training_file(args) -> None:
    """The training file: the positional argument or VW's ``-d`` (one of them, once)."""
    if args.train is not None and args.data is not None and args.train != args.data:
        raise ValueError(f"two training files: {args.train} and -d {args.data}")
    args.train = args.train if args.train is not None else args.data
    if args.train is None:
        raise ValueError("no training file: give it as the first argument or with -d")


def _write_predictions(args, predictions, path, fmt: str) -> None:
    """``-p``: one score per example, the sigmoid of it with ``--link logistic``, its sign with
    ``--binary``, the example's tag after it (VW files, VW's)."""
    from sketchopt.stream import data, vw_outputs

    tags = list(data.vw_tags(path)) if fmt == "vw" else None
    text = vw_outputs.format_predictions(predictions, link=args.link, binary=args.binary, tags=tags)
    args.predict.write_text(text)


def _tags_of(path, fmt: str):
    """The training file's tags pass after pass (VW files; ``None`` otherwise)."""
    from sketchopt.stream import data

    if fmt != "vw":
        return None

    def forever():
        while True:
            yield from data.vw_tags(path)

    return forever()


def _rows_of(chunk):
    """A training chunk's rows on the host: mask, labels, importance weights and each row's
    number of features as VW counts them (the constant and the crosses included)."""
    import numpy as np

    from sketchopt.stream.crosses import CrossedExamples
    from sketchopt.stream.examples import FlatExamples

    mask = np.asarray(chunk.mask, bool)
    labels = np.asarray(chunk.labels, np.float64)
    weights = getattr(chunk, "weights", None)
    weights = np.ones_like(labels) if weights is None else np.asarray(weights, np.float64)
    if isinstance(chunk, FlatExamples):
        features = np.asarray(chunk.stops, np.int64) - np.asarray(chunk.starts, np.int64)
    elif isinstance(chunk, CrossedExamples):
        spans = np.asarray(chunk.spans, np.int64)  # (rows, pairs, 4): start, count of a and b
        a, b = spans[..., 1], spans[..., 3]
        square = np.asarray(chunk.layout.square, bool)
        features = np.asarray(chunk.counts, np.int64) + np.where(
            square, a * (a + 1) // 2, a * b
        ).sum(-1)
    else:
        features = (np.asarray(chunk.values) != 0).sum(-1)
    return mask, labels, weights, features


class _Watch:
    """The training run's per-example outputs: ``-p``'s progressive predictions (without
    ``--test``) and ``-P``'s progress lines; a context that opens and closes the file. It sees
    each chunk as it goes to the runner (:meth:`wrap`) and its predictions after its pass
    (called as the runner's ``observe``)."""

    def __init__(self, args):
        self.args = args
        self.rows: collections.deque = collections.deque()
        self.file = None
        self.lines = None
        self.tags = None

    def __enter__(self):
        from sketchopt.stream import vw_outputs

        if self.args.predict is not None and self.args.test is None:
            self.file = open(self.args.predict, "w")  # noqa: SIM115 (closed by __exit__)
            self.tags = _tags_of(self.args.train, _format(self.args, self.args.train))
        if self.args.progress is not None and not self.args.quiet:
            self.lines = vw_outputs.ProgressLines(self.args.progress, binary=self.args.binary)
        return self

    def __exit__(self, *exc):
        if self.file is not None:
            self.file.close()

    @property
    def active(self) -> bool:
        return self.file is not None or self.lines is not None

    def wrap(self, chunks):
        for chunk in chunks:
            if self.active:
                self.rows.append(_rows_of(chunk))
            yield chunk

    def __call__(self, p, loss, scored):
        from sketchopt.stream import vw_outputs

        mask, labels, weights, features = (a[: p.shape[-1]] for a in self.rows.popleft())
        if self.file is not None:
            scores = p[mask]
            tags = None if self.tags is None else list(itertools.islice(self.tags, len(scores)))
            self.file.write(
                vw_outputs.format_predictions(
                    scores, link=self.args.link, binary=self.args.binary, tags=tags
                )
            )
        if self.lines is not None:
            keep = scored.astype(bool)
            self.lines.add(loss[keep], weights[keep], labels[keep], p[keep], features[keep])


def _feature_names(path, fmt: str, info, config) -> dict[int, str]:
    """``--invert_hash``'s names of the weights, from the file ``path`` (VW's or the file's own
    indices, ``Constant`` for the constant)."""
    from sketchopt.stream import data

    if fmt == "vw":
        names = data.vw_feature_names(path, bits=_vw_bits(config), quadratic=config["quadratic"])
    else:
        names = data.svmlight_feature_names(path, info, bits=config["bits"], dim=config["dim"])
    if config["constant"]:
        names[int(config["dim"])] = "Constant"
    return names


def _write_models(args, config, path, info, learner, state) -> None:
    """``--readable_model`` and ``--invert_hash`` (:mod:`sketchopt.stream.vw_outputs`), the
    names read from ``path`` (the training file, or the scored file of ``-t``)."""
    if args.readable_model is None and args.invert_hash is None:
        return
    import numpy as np

    from sketchopt import __version__
    from sketchopt.stream import vw_outputs

    weights = np.asarray(learner.weights(state), np.float64)
    if config["loss"] == "squared":
        labels = (float(min(info.labels)), float(max(info.labels)))
    else:
        labels = (-1.0, 1.0)
    fmt = config["format"]
    bits = _vw_bits(config) if fmt == "vw" else config["bits"]
    if bits is None:  # an svmlight file kept unhashed: the bits its dimension needs
        bits = max(int(config["dim"] - 1).bit_length(), 1)
    options = f"--learner {config['learner']} --loss_function {config['loss']}"
    options += "".join(f" -q {q}" for q in config["quadratic"])
    options += "".join(f" {k}={v}" for k, v in config["hyperparameters"].items())
    options += "" if config["constant"] else " --noconstant"
    text = {"version": f"sketchopt {__version__}", "bits": bits, "labels": labels,
            "options": options}  # fmt: skip
    if args.readable_model is not None:
        args.readable_model.write_text(vw_outputs.readable_model(weights, **text))
    if args.invert_hash is not None:
        names = _feature_names(path, fmt, info, config)
        args.invert_hash.write_text(vw_outputs.readable_model(weights, names=names, **text))


def _prepare(args, config: dict, saved: dict | None):
    """The training file's format and scan, and the run's index base, classes, dimension and
    learner, written into ``config`` (a resumed run keeps the checkpoint's)."""
    from sketchopt.stream import data, learners
    from sketchopt.stream.examples import binary_classes

    fmt = _format(args, args.train)
    if saved is not None and config["format"] not in (None, fmt):
        raise ValueError(f"{args.train} is {fmt}, the checkpoint's files were {config['format']}")
    config["format"] = fmt
    config["constant"] = bool(config["constant"]) if config["constant"] is not None else False
    config["quadratic"] = list(config["quadratic"] or [])
    # The index base is decided once: by the first training file (one-based unless it holds an
    # index 0), then kept for the test file and for resumed runs, which a file of their own,
    # lacking an index 0, would otherwise shift.
    info = _scan(args.train, fmt, config)
    if fmt == "svmlight":
        config["zero_based"] = info.zero_based
    # The labels meaning -1 and +1, from the training file (kept for the test file and resumes)
    if config.get("classes") is None:
        config["classes"] = binary_classes(info.labels, config["loss"])
    config["dim"] = _feature_dim(fmt, info, config) if saved is None else saved["dim"]
    dim = data.weights_dim(config["dim"], config["constant"])
    hyper = config["hyperparameters"]
    if hyper.get("learning_rate") == _AUTO:  # kept as the number, so that a resume keeps it
        hyper["learning_rate"] = _normalized_rate(info, config["constant"])
    if "sketch_size" in hyper and hyper["sketch_size"] is None:  # not given: the default
        oja = config["learner"] == "oja_son"
        hyper["sketch_size"] = min(DEFAULT_SKETCH_SIZE, dim) if oja else DEFAULT_SKETCH_SIZE
    learner = learners.make_learner(config["learner"], loss=config["loss"], **hyper)
    return fmt, info, dim, learner


def _check(args) -> None:
    """What can be checked before any import of JAX: the files, the outputs' folders, the
    flags that go together (each a ``ValueError`` naming what is wrong)."""
    _training_file(args)
    _check_vw_flags(args)
    if args.testonly:
        _check_test_only(args)
    _check_inputs(args)


def run(args) -> dict:
    """Runs the command line's job for parsed ``args``; returns the summary."""
    _check(args)
    config, saved = _resolve(args)
    fmt, info, dim, learner = _prepare(args, config, saved)
    state, start, curve = None, None, None
    if saved is not None:
        state, start = _restore(args.resume, learner, dim)
        curve = [dict(line) for line in saved["curve"]]
    if args.testonly:
        return _test_only(args, config, info, learner, state)
    with tempfile.TemporaryDirectory(prefix="sketchopt-cache-") as cache, _Watch(args) as watch:
        result, seconds = _passes(
            args, config, info, fmt, dim, learner, state, start, curve, pathlib.Path(cache), watch
        )
    summary = _summary(args, config, fmt, result, seconds, info.examples * args.passes)
    if args.test is not None:
        test_fmt = _format(args, args.test)
        if test_fmt != fmt:
            raise ValueError(f"{args.test} is {test_fmt}, the training file {fmt}")
        scored = _score(
            args, args.test, _scan(args.test, fmt, config), config, learner, result.state
        )
        summary.update({k: scored[k] for k in ("test_loss", "test_error", "test_examples")})
    if args.save is not None:
        _save(args.save, config, result.state, result)
    _write_models(args, config, args.train, info, learner, result.state)
    if args.json is not None:
        args.json.write_text(_dumps(summary))
    if not args.quiet:
        _report(summary, table=args.progress is None)
    return summary


def _summary(args, config, fmt, result, seconds, examples) -> dict:
    """The training run's summary (the JSON's keys)."""
    summary = {
        "learner": config["learner"],
        "loss": config["loss"],
        "format": fmt,
        "dim": config["dim"],
        "constant": config["constant"],
        "quadratic": config["quadratic"],
        "classes": config["classes"],
        "hyperparameters": config["hyperparameters"],
        "layout": config.get("layout"),
        "width": config.get("nnz") if config.get("layout") == "padded" else config.get("width"),
        "passes": args.passes,
        "examples": result.examples,
        "progressive_loss": float(result.progressive_loss),
        "progressive_error": float(result.progressive_error),
        "examples_per_second": examples / seconds if seconds else 0.0,
        "seconds": seconds,
        "skipped": int(result.state.nonfinite_count),
        "curve": [{k: v for k, v in line.items() if k != "loss_sum"} for line in result.curve],
    }
    if result.holdout is not None:
        summary.update(
            holdout_loss=float(result.holdout_loss),
            holdout_error=float(result.holdout_error),
            holdout_examples=int(result.holdout.examples),
        )
    return summary


def _check_vw_flags(args) -> None:
    """VW's flags of :data:`VW_ONLY` given with a value this library has not, ``--binary`` with
    ``--link logistic`` and a ``-P`` that is no number are refused, saying what to use."""
    for flag, vw in VW_ONLY.items():
        value = getattr(args, f"vw_{flag[2:]}")
        if value is None or vw.accepted is None:
            continue
        if not vw.takes:
            raise ValueError(f"{flag}: {vw.meaning}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{flag} {value!r} is not a number") from None
        if number not in vw.accepted:
            raise ValueError(f"{flag} {value}: {vw.meaning}")
    if args.binary and args.link == "logistic":
        raise ValueError("--binary predicts -1 or 1: it does not go with --link logistic")
    if args.progress is not None:
        from sketchopt.stream import vw_outputs

        vw_outputs.progress_schedule(args.progress)


def _check_test_only(args) -> None:
    """``-t`` scores the positional file with a checkpoint's weights: nothing to learn from."""
    if args.resume is None:
        raise ValueError("-t/--testonly needs -i/--resume: the weights to test")
    if not args.resume.is_dir():
        raise ValueError(f"-t/--testonly: no model directory {args.resume} (-i/--resume)")
    given = [flag for flag, on in (("--test", args.test is not None), ("--save", args.save),
             ("--passes", args.passes != 1)) if on]  # fmt: skip
    if given:
        raise ValueError(f"-t/--testonly learns nothing: {', '.join(given)} do(es) not apply")


def _check_inputs(args) -> None:
    """Every file the run reads exists (the training file, ``--test``), the outputs' folders
    too, and ``-i/--resume`` is a ``--save`` directory: what is missing is named in one line,
    before any reading (or import of JAX) starts."""
    for flag, path in (("training file", args.train), ("--test file", args.test)):
        if path is not None and not path.exists():
            raise ValueError(f"no such {flag}: {path}")
        if path is not None and path.is_dir():
            raise ValueError(f"the {flag} {path} is a directory")
    outputs = (
        ("--json", args.json),
        ("-p/--predict", args.predict),
        ("--readable_model", args.readable_model),
        ("--invert_hash", args.invert_hash),
    )
    for flag, path in outputs:  # fmt: skip
        if path is not None and not path.parent.is_dir():
            raise ValueError(f"{flag} {path}: no directory {path.parent} to write it in")
    if args.resume is None:
        return
    if not args.resume.is_dir():
        raise ValueError(f"no model directory {args.resume} (-i/--resume: a --save directory)")
    if not (args.resume / _CONFIG).is_file():
        raise ValueError(
            f"{args.resume} is not a --save directory (-i/--resume): it has no {_CONFIG}"
        )


def _os_error(err: OSError) -> str:
    """An ``OSError`` in a line: the file and the reason, without ``[Errno N]``."""
    if err.filename is None:
        return str(err)
    return f"{err.filename}: {err.strerror or err}"


def _score(args, path, info, config, learner, state) -> dict:
    """``path`` read as a test file (the run's dimension, index base, classes and crosses) and
    scored by ``state`` without learning; ``-p`` gets its scores."""
    from sketchopt.stream import runner

    chunks = _read(
        path, config["format"], info, config, args.chunk_size, test=True,
        crossed=config.get("layout") == "crossed",
    )  # fmt: skip
    start = time.perf_counter()
    test_loss, test_error, predictions = runner.evaluate(learner, state, chunks)
    seconds = time.perf_counter() - start
    if args.predict is not None:
        _write_predictions(args, predictions, path, config["format"])
    return {
        "test_loss": test_loss,
        "test_error": test_error,
        "test_examples": len(predictions),
        "examples_per_second": len(predictions) / seconds if seconds else 0.0,
        "seconds": seconds,
    }


def _test_only(args, config, info, learner, state) -> dict:
    """VW's ``-t -i``: the positional file scored with the checkpoint's weights (:func:`_score`),
    nothing learned."""
    keys = ("learner", "loss", "format", "dim", "constant", "quadratic", "classes")
    summary = {k: config[k] for k in keys} | {"hyperparameters": config["hyperparameters"]}
    summary |= _score(args, args.train, info, config, learner, state)
    _write_models(args, config, args.train, info, learner, state)
    if args.json is not None:
        args.json.write_text(_dumps(summary))
    if not args.quiet:
        print(f"test: {summary['test_examples']} examples, error {summary['test_error']:.4f}")
    return summary


def _report(summary: dict, table: bool = True) -> None:
    """The run's report on stdout: the doubling table (``table``; not with VW's ``-P``
    lines) and the totals."""
    if table:
        print(f"{'examples':>12} {'average loss':>14} {'since last':>12} {'average error':>14}")
    for line in summary["curve"] if table else ():
        print(
            f"{line['examples']:>12d} {line['average_loss']:>14.6f} {line['since_last']:>12.6f} "
            f"{line['average_error']:>14.6f}"
        )
    print(
        f"{summary['examples']} examples, progressive loss {summary['progressive_loss']:.6f}, "
        f"error {summary['progressive_error']:.4f}, {summary['examples_per_second']:.0f} "
        "examples/s (the pass alone)"
    )
    if "holdout_error" in summary:
        print(
            f"holdout: {summary['holdout_examples']} examples, loss "
            f"{summary['holdout_loss']:.6f}, error {summary['holdout_error']:.4f}"
        )
    if "test_error" in summary:
        print(f"test: {summary['test_examples']} examples, error {summary['test_error']:.4f}")


class SavedModel(NamedTuple):
    """A ``--save`` directory read back (:func:`load_model`)."""

    #: The learned weights, NumPy ``(d,)`` (``d`` the run's ``dim``, plus one with the
    #: constant, its weight last): the weights the learner predicts with (``w . x``).
    weights: Any
    #: The run's configuration: ``learner``, ``loss``, ``hyperparameters``, ``dim``, ``bits``,
    #: ``constant``, ``quadratic``, ``classes``, ``format``, ``zero_based``, ``layout`` and the
    #: progressive ``curve`` (non-finite figures as NaN, an infinite ``bound`` infinite).
    config: dict
    #: The learner's whole state (as ``--resume`` restores it).
    state: Any


def load_model(path) -> SavedModel:
    """The weights, configuration and state saved by ``sketchopt-stream ... --save DIR`` (also
    ``-f DIR``) in ``path``. A missing ``path`` is a ``FileNotFoundError``, a folder that is not
    such a directory a ``ValueError``, each naming it."""
    import numpy as np

    from sketchopt.stream import data, learners

    directory = pathlib.Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"no model directory {directory}")
    if not (directory / _CONFIG).is_file() or not (directory / _STATE).is_dir():
        raise ValueError(
            f"{directory} is not a model directory (sketchopt-stream --save): it has no "
            f"{_CONFIG} and {_STATE}/"
        )
    config = _load_config(directory)
    hyper = dict(config["hyperparameters"])
    learner = learners.make_learner(config["learner"], loss=config["loss"], **hyper)
    state, _ = _restore(directory, learner, data.weights_dim(config["dim"], config["constant"]))
    return SavedModel(np.asarray(learner.weights(state)), config, state)


def cache_folder() -> pathlib.Path:
    """The command line's JAX compilation cache folder: ``$SKETCHOPT_JAX_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/sketchopt/jax``, else ``~/.cache/sketchopt/jax``."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return pathlib.Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "sketchopt" / "jax"


#: JAX's settings :func:`compilation_cache` sets, and puts back.
_CACHE_SETTINGS = ("jax_enable_compilation_cache", "jax_compilation_cache_dir",
                   "jax_persistent_cache_min_compile_time_secs",
                   "jax_persistent_cache_min_entry_size_bytes")  # fmt: skip


@contextlib.contextmanager
def compilation_cache(enabled: bool = True):
    """JAX's persistent compilation cache for what runs inside (the module docstring): on in
    :func:`cache_folder` with every program kept, or with ``enabled=False`` off; where JAX's
    own cache folder is set (``JAX_COMPILATION_CACHE_DIR`` or ``jax_compilation_cache_dir``)
    and ``$SKETCHOPT_JAX_CACHE_DIR`` is not, JAX's cache as configured. JAX's settings are put
    back after it (a process that compiles more, as the tests, is left as it was)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    jax_own = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
    if enabled and CACHE_ENV not in os.environ and jax_own:
        yield
        return
    settings: dict[str, Any] = {"jax_enable_compilation_cache": False}
    if enabled:
        folder = cache_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:  # no cache folder to be had (a read-only home): run without
            pass
        else:
            settings = {"jax_enable_compilation_cache": True,
                        "jax_compilation_cache_dir": str(folder),
                        "jax_persistent_cache_min_compile_time_secs": 0.0,
                        "jax_persistent_cache_min_entry_size_bytes": 0}  # fmt: skip
    before = {name: getattr(jax.config, name) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    jax_cache.reset_cache()  # a cache this process had already looked at is looked at again
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        jax_cache.reset_cache()


def main(argv=None, *, prog: str | None = None) -> int:
    """The command line: ``argv`` (default ``sys.argv[1:]``) parsed -- ``--help`` and argparse's
    errors answer there, before any import of JAX -- and run, with JAX's persistent compilation
    cache (:func:`compilation_cache`; ``--no-cache`` off); returns the exit status (2 with an
    ``error: ...`` line on stderr). ``prog``: the name the usage line gives (default
    :func:`_prog`'s, the name the program was called by)."""
    args = build_parser(_prog(argv) if prog is None else prog).parse_args(argv)
    try:
        _check(args)  # (a missing file is named before JAX is imported)
        with compilation_cache(not args.no_cache):
            run(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file that vanished, a folder that cannot be written, ...
        print(f"error: {_os_error(err)}", file=sys.stderr)
        return 2
    return 0
