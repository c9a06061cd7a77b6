"""Sparse data on the host: LIBSVM/svmlight files in fixed-size chunks, Vowpal Wabbit's text
format, feature hashing and quadratic crosses. NumPy/SciPy/scikit-learn code; the chunks it yields
are :class:`~sketchopt.stream.examples.SparseExamples` that the learners scan on the device.

**Reading svmlight files.** Lines are parsed by scikit-learn's ``load_svmlight_file`` (its Cython
reader), never by code of this module. The file is read as raw bytes in blocks of about
``chunk_bytes``, cut after the block's last newline (the partial last line is carried over to the
next block), and each block of whole lines is handed to ``load_svmlight_file`` as an in-memory
file. Memory is therefore ``O(chunk_bytes + longest line + chunk_size * nnz)`` whatever the size
of the file, and ``.gz``/``.bz2`` files stream through the same code.

scikit-learn's own ``offset``/``length`` byte ranges are deliberately not used: a range starts by
seeking to ``offset`` and dropping the rest of the line it lands in, then reads whole lines until
it has read past ``offset + length``, checking only *after* each line. When a line is longer than
``length``, the ranges that start inside it read the line that follows it too, a line that also
belongs to the range it starts in, so it is returned twice (a 218-byte file of 5 lines, one of
189 bytes, read in 5-byte ranges gave 43 rows; in 64-byte ranges 7). Each range also reopens
(and, for a compressed file, decompresses again up to) ``offset``. Reading whole-line blocks
ourselves has neither problem.

**Zero- or one-based.** Every block is parsed with ``zero_based=True`` (the raw indices), and the
shift is decided for the whole file: ``zero_based="auto"`` means one-based unless an index 0
occurs *anywhere* in the file (scikit-learn's own rule when it reads a whole file). scikit-learn's
"auto" decides per call, so blocks of one file would be shifted inconsistently. Deciding needs the
whole file, hence :func:`scan_svmlight`, one pass in constant memory that also finds the number of
examples, the dimension ``d`` (largest index + 1 after the shift), the static bound ``nnz`` on the
non-zeros of an example and the label values, and validates everything (below), so that bad data
fails before learning starts, not hours into a stream. :func:`iter_svmlight` scans first (pass
``info=`` to reuse a scan across epochs), so it parses the file twice.

**Validation** (a ``ValueError`` naming the file, the line number and the line): whatever
scikit-learn's reader rejects (a negative index, indices not strictly increasing -- so a file
cannot hold duplicate indices: duplicates only arise from hashing, and are summed --, a malformed
``index:value``); a non-finite value or label; an index 0 in a file
read as one-based (``zero_based=False``); labels outside the loss's domain (checked once for the
whole file by :func:`~sketchopt.stream.examples.check_labels`, which maps ``{0, 1}`` to
``{-1, +1}`` for classification losses, and any other two labels by their order,
:func:`~sketchopt.stream.examples.binary_classes`). Examples without features are legitimate
and kept (all padding, ``mask`` true); blank and comment-only lines are not examples
(scikit-learn skips them), and ``qid:`` fields are dropped.

**Dimension** (the contract of the command line's ``--bits B``, :func:`stream_dim`): with
``bits``, the weights have dimension ``2**bits``, and the data's indices are hashed into it by
:func:`~sketchopt.stream.examples.hash_indices` (MurmurHash3, colliding features summed) when the
data's own dimension is larger than ``2**bits``, else kept as they are; without ``bits``, ``dim``
(given, at least the data's) or the data's own dimension. **Any index is hashed**: scikit-learn's
reader parses indices into a C ``int``, so a block holding an index of ``2**31`` or more (64-bit
feature ids, as hashed click logs write them) is parsed by this module's own reader instead
(:func:`_parse_wide`, the same validation), and such an index is hashed by :func:`hash_any`
(:func:`~sketchopt.stream.examples.hash_indices` of the index folded to 31 bits, below); without
``bits`` such a file is refused (its dimension would pass ``2**31``: hash it).

**Feature names** (the command line's ``--invert_hash``, VW's): :func:`svmlight_feature_names`
names each weight index by the file's own index (``"17"``, one-based files as written),
:func:`vw_feature_names` by VW's names (``namespace^feature``, a default-namespace feature by its
bare name, a cross ``a^x*b^y``), the first name seen at an index kept when features collide (as
VW keeps one).

**Vowpal Wabbit's text format** (:func:`read_vw` whole, :func:`iter_vw` in chunks in constant
memory, :func:`detect_format` tells it from svmlight by the ``|``) is read by a small reader of
its header (label, importance weight, tag) and namespaces; features are hashed by scikit-learn's
``FeatureHasher`` on the names ``"namespace^feature"``, which is not VW's hashing (VW seeds
MurmurHash with the namespace's hash, takes all-digit feature names as indices, and combines
crossed hashes with FNV), so feature indices differ from VW's. That does not matter for
learning: only which features collide differs.

**Quadratic crosses** (:func:`cross_features`, VW's ``-q aa`` on numeric features) follow VW's
default (no ``--permutations``) for a namespace crossed with itself: the unordered pairs ``i <= j``
of the example's features, the square terms included. VW generates them so since issue 698 (the
inner loop starts at the outer feature, ``PROCESS_SELF_INTERACTIONS`` is true); VW 7.10 kept a
square term only for a value other than 1. VW files' ``-q`` crosses (:func:`read_vw`,
:func:`iter_vw`) are built on the host and stored, or, with ``crosses="device"``, left to the
compiled step (:mod:`sketchopt.stream.crosses`, which defines their indices).
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np
import scipy.sparse

from sketchopt.stream.crosses import CrossedExamples, CrossLayout, cross_index
from sketchopt.stream.examples import (
    SparseExamples,
    binary_classes,
    check_labels,
    from_csr,
    hash_indices,
    pad_rows,
    with_constant,
)

__all__ = [
    "MAX_LABELS",
    "SvmlightInfo",
    "VwInfo",
    "cross_features",
    "cross_layout",
    "detect_format",
    "hash_any",
    "hash_pairs",
    "iter_svmlight",
    "iter_vw",
    "load_svmlight",
    "read_vw",
    "scan_svmlight",
    "scan_vw",
    "stream_dim",
    "svmlight_feature_names",
    "vw_feature_names",
    "vw_tags",
    "weights_dim",
]

#: The most distinct label values :class:`SvmlightInfo` keeps (the smallest ones).
MAX_LABELS = 1000

# scikit-learn's reader parses indices into a C int.
_MAX_INDEX = 2**31 - 1


class SvmlightInfo(NamedTuple):
    """What one pass over an svmlight file found (:func:`scan_svmlight`)."""

    examples: int  # number of examples (lines with a label)
    dim: int  # largest feature index + 1 after the zero-based shift (0 without features)
    nnz: int  # most non-zeros of one example (explicit zeros not counted)
    zero_based: bool  # resolved: whether the file's indices start at 0
    labels: tuple  # sorted distinct label values, at most MAX_LABELS (the smallest)
    normalized_norm: float = 0.0  # FeatureScales.normalized_norm: mean sum_i (x_i / s_i)^2


class _Raw(NamedTuple):
    """One block of lines as scikit-learn parsed it, indices raw (``zero_based=True``)."""

    data: np.ndarray  # float64
    indices: np.ndarray  # int64
    indptr: np.ndarray  # int64
    labels: np.ndarray  # float64


# --------------------------------------------------------------------------------------------
# Reading blocks of whole lines and parsing them with scikit-learn.


def _open_binary(path):
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def _blocks(path, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
    """``(block, first line number)``: the file in blocks of whole lines of about ``chunk_bytes``
    bytes (more where a line is longer)."""
    line = 1
    with _open_binary(path) as f:
        carry: list[bytes] = []
        while True:
            data = f.read(chunk_bytes)
            if not data:
                break
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # no line ends in this read: keep collecting
                carry.append(data)
                continue
            block = b"".join([*carry, data[:cut]])
            carry = [data[cut:]] if cut < len(data) else []
            yield block, line
            line += block.count(b"\n")
        if carry:
            yield b"".join(carry), line


#: Blocks up to this size are parsed by :func:`_parse_wide` (the same validation), sparing a
#: small file scikit-learn's import (1.3 s, most of a short command-line run); larger ones by
#: scikit-learn's compiled reader, which is faster per line.
_SMALL_BLOCK = 1 << 20


def _parse(block: bytes) -> _Raw:
    if len(block) <= _SMALL_BLOCK:
        return _parse_wide(block)
    from sklearn.datasets import load_svmlight_file

    try:
        x, y = load_svmlight_file(io.BytesIO(block), zero_based=True, dtype=np.float64)
    except OverflowError:  # an index of 2**31 or more: the 64-bit reader
        return _parse_wide(block)
    x = scipy.sparse.csr_matrix(x)
    return _Raw(
        np.asarray(x.data, np.float64),
        np.asarray(x.indices, np.int64),
        np.asarray(x.indptr, np.int64),
        np.asarray(y, np.float64),
    )


def _parse_wide(block: bytes) -> _Raw:
    """A block of svmlight lines with 64-bit indices (scikit-learn's reader stops at
    ``2**31 - 1``; also every small block, :data:`_SMALL_BLOCK`), validated as scikit-learn
    validates, with its messages: ``label [qid:q] index:value ...``, a
    ``#`` comment to the end of the line, indices non-negative and strictly increasing."""
    data, indices, indptr, labels = [], [], [0], []
    for line in block.split(b"\n"):
        words = line.split(b"#", 1)[0].split()
        if not words:
            continue
        try:
            labels.append(float(words[0]))
            pairs = [w.split(b":", 1) for w in words[1:] if not w.startswith(b"qid:")]
            index = np.asarray([int(k) for k, _ in pairs], np.int64)
            data.extend(float(v) for _, v in pairs)
        except (ValueError, OverflowError):
            raise ValueError(f"cannot read {line.decode('utf-8', 'replace').strip()!r}") from None
        # scikit-learn's messages, so that an error reads the same from either reader
        if index.size and index.min() < 0:
            raise ValueError(f"Invalid index {index.min()} in SVMlight/LibSVM data file.")
        if np.any(np.diff(index) <= 0):
            raise ValueError(
                "Feature indices in SVMlight/LibSVM data file should be sorted and unique."
            )
        indices.append(index)
        indptr.append(indptr[-1] + index.size)
    return _Raw(
        np.asarray(data, np.float64),
        np.concatenate(indices) if indices else np.zeros(0, np.int64),
        np.asarray(indptr, np.int64),
        np.asarray(labels, np.float64),
    )


def hash_any(indices, bits: int, seed: int = 0) -> np.ndarray:
    """Non-negative 64-bit feature indices hashed into ``[0, 2**bits)``: those below ``2**31``
    by :func:`~sketchopt.stream.examples.hash_indices` (so the files it reads hash as before),
    a wider one by the same hash of its low 31 bits plus ``0x9E3779B1`` times the 32-bit
    MurmurHash3 of its high bits (mod ``2**31``): every bit of the index counts."""
    from sklearn.utils import murmurhash3_32

    indices = np.asarray(indices, np.int64)
    wide = indices > _MAX_INDEX
    if not wide.any():
        return hash_indices(indices, bits, seed)
    out = np.empty_like(indices)
    out[~wide] = hash_indices(indices[~wide], bits, seed)
    high = np.asarray(murmurhash3_32((indices[wide] >> 31).astype(np.int32), seed=seed,
                                     positive=True), np.int64)  # fmt: skip
    folded = ((indices[wide] & _MAX_INDEX) + high * 0x9E3779B1) & _MAX_INDEX
    out[wide] = hash_indices(folded, bits, seed)
    return out


def _problem(raw: _Raw, one_based: bool) -> str | None:
    """What is wrong with a parsed block, or ``None``."""
    if not np.all(np.isfinite(raw.data)):
        return "a non-finite feature value"
    if not np.all(np.isfinite(raw.labels)):
        return "a non-finite label"
    if one_based and raw.indices.size and raw.indices.min() == 0:
        return "feature index 0 in a file read as one-based (zero_based=False)"
    return None


def _line_problem(lines: list[bytes], one_based: bool) -> str | None:
    try:
        return _problem(_parse(b"\n".join(lines)), one_based)
    except ValueError as err:
        return f"cannot parse it ({err})"


def _located(path, block: bytes, line0: int, one_based: bool, error: str) -> ValueError:
    """The error of ``block`` with the number and text of its first bad line, found by
    bisection (every problem is one line's, and a parse call costs ~0.1 ms: line by line, a
    block of short lines would take seconds)."""
    lines = block.split(b"\n")
    low, high = 0, len(lines)  # the first bad line lies in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if _line_problem(lines[low:middle], one_based) is not None:
            high = middle
        else:
            low = middle
    problem = _line_problem(lines[low:high], one_based)
    if problem is None:  # not one line's problem after all
        end = line0 + block.count(b"\n")
        return ValueError(f"{os.fspath(path)}, lines {line0} to {end}: {error}")
    text = lines[low].decode("utf-8", "replace").rstrip()
    text = text if len(text) <= 80 else text[:77] + "..."
    return ValueError(f"{os.fspath(path)}, line {line0 + low}: {problem}: {text!r}")


def _raw_blocks(path, chunk_bytes: int, one_based: bool) -> Iterator[_Raw]:
    """The file's blocks parsed and validated (see the module docstring)."""
    if int(chunk_bytes) < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    for block, line0 in _blocks(path, int(chunk_bytes)):
        try:
            raw = _parse(block)
            problem = _problem(raw, one_based)
        except ValueError as err:
            problem = str(err)
        if problem is not None:
            raise _located(path, block, line0, one_based, problem)
        yield raw


# --------------------------------------------------------------------------------------------
# The scan.


class FeatureScales:
    """Each feature's largest ``|value|`` and sum of squares over a stream, for VW's normalized
    learning rate (Ross, Mineiro & Langford 2013, "Normalized online learning", Alg. 2's ``N``):
    :meth:`normalized_norm` is the mean over examples of ``sum_i (x_i / s_i)^2``, ``s_i`` the
    feature's largest ``|value|`` in the stream (VW takes the running one). Binary features give
    the mean number of non-zeros. Memory: three numbers a distinct feature."""

    def __init__(self):
        self.keys = np.zeros((0,), np.int64)
        self.largest = np.zeros((0,))
        self.squares = np.zeros((0,))
        self.examples = 0

    def add(self, indices, values, examples: int) -> None:
        """One block: ``indices`` and ``values`` of its non-zeros (any integer keys),
        ``examples`` its example count."""
        self.examples += examples
        keys = np.concatenate([self.keys, np.asarray(indices, np.int64)])
        values = np.abs(np.asarray(values, np.float64))
        largest = np.concatenate([self.largest, values])
        squares = np.concatenate([self.squares, values**2])
        self.keys, inverse = np.unique(keys, return_inverse=True)
        self.largest = np.zeros(self.keys.shape)
        np.maximum.at(self.largest, inverse, largest)
        self.squares = np.bincount(inverse, squares, minlength=self.keys.size)

    def normalized_norm(self) -> float:
        """``mean_t sum_i (x_ti / s_i)^2`` (0 for an empty stream)."""
        seen = self.largest > 0
        total = float(np.sum(self.squares[seen] / self.largest[seen] ** 2))
        return total / self.examples if self.examples else 0.0


class _Scan:
    """Accumulates :class:`SvmlightInfo` over raw blocks."""

    def __init__(self):
        self.examples = 0
        self.max_index = -1
        self.has_zero = False
        self.nnz = 0
        self.labels = np.zeros((0,))
        self.scales = FeatureScales()

    def add(self, raw: _Raw) -> None:
        self.examples += raw.labels.shape[0]
        self.scales.add(raw.indices, raw.data, raw.labels.shape[0])
        if raw.indices.size:
            self.max_index = max(self.max_index, int(raw.indices.max()))
            self.has_zero = self.has_zero or bool(raw.indices.min() == 0)
        nonzero = np.concatenate([[0], np.cumsum(raw.data != 0)])
        counts = nonzero[raw.indptr[1:]] - nonzero[raw.indptr[:-1]]
        self.nnz = max(self.nnz, int(counts.max(initial=0)))
        self.labels = np.union1d(self.labels, raw.labels)[:MAX_LABELS]

    def info(self, zero_based) -> SvmlightInfo:
        resolved = self.has_zero if zero_based == "auto" else bool(zero_based)
        dim = max(self.max_index + (1 if resolved else 0), 0)
        labels = tuple(float(v) for v in self.labels)
        norm = self.scales.normalized_norm()
        return SvmlightInfo(self.examples, dim, self.nnz, resolved, labels, norm)


def _check_zero_based(zero_based) -> None:
    if zero_based != "auto" and not isinstance(zero_based, (bool, np.bool_)):
        raise ValueError(f'zero_based must be "auto", True or False, got {zero_based!r}')


def scan_svmlight(path, *, zero_based="auto", chunk_bytes: int = 1 << 24) -> SvmlightInfo:
    """One pass over the svmlight/LIBSVM file ``path`` in constant memory: its
    :class:`SvmlightInfo`, after validating every line (see the module docstring).

    ``zero_based``: ``True``, ``False`` or ``"auto"`` -- one-based unless an index 0 occurs
    anywhere in the file. ``chunk_bytes``: the size of the blocks the file is read in.
    """
    _check_zero_based(zero_based)
    scan = _Scan()
    for raw in _raw_blocks(path, chunk_bytes, one_based=zero_based is False):
        scan.add(raw)
    return scan.info(zero_based)


def stream_dim(info: SvmlightInfo, bits: int | None = None, dim: int | None = None) -> int:
    """The dimension ``d`` of the weights for data described by ``info``: ``2**bits`` with
    ``bits`` (the data hashed into it if it has more features), else ``dim``, else the data's own
    (at least 1)."""
    if bits is not None:
        bits = int(bits)
        if not 1 <= bits <= 31:
            raise ValueError(f"bits must lie in [1, 31], got {bits}")
        if dim is not None and int(dim) != 2**bits:
            raise ValueError(f"dim = {dim} contradicts bits = {bits} (dimension 2**{bits})")
        return 2**bits
    if dim is None and info.dim > _MAX_INDEX + 1:
        raise ValueError(
            f"a feature index of {info.dim - 1}, above 2**31 - 1: hash the features into 2**B "
            "with bits=B (the command line's -b B)"
        )
    if dim is not None:
        if int(dim) < info.dim:
            raise ValueError(
                f"the data has {info.dim} features, more than dim = {dim} (hash them with bits)"
            )
        return max(int(dim), 1)
    return max(info.dim, 1)


# --------------------------------------------------------------------------------------------
# Iteration.


class _Plan(NamedTuple):
    info: SvmlightInfo
    dim: int  # the features' dimension (the constant, if any, is feature dim)
    nnz: int
    bits: int | None  # hash into 2**bits when not None
    seed: int
    constant: bool = False
    drop_unseen: bool = False
    classes: tuple | None = None  # (negative, positive) of check_labels


def _check_unseen(unseen) -> bool:
    if unseen not in ("error", "drop"):
        raise ValueError(f'unseen must be "error" or "drop", got {unseen!r}')
    return unseen == "drop"


def _plan(
    info, *, loss, dim, bits, nnz, zero_based, hash_seed, constant=False, unseen="error",
    source=None, classes=None,
) -> _Plan:  # fmt: skip
    if zero_based != "auto" and bool(zero_based) != info.zero_based:
        raise ValueError(f"zero_based={zero_based} contradicts the scan's {info.zero_based}")
    drop = _check_unseen(unseen)
    if drop and bits is None and dim is not None:  # features beyond dim are dropped, not refused
        info = info._replace(dim=min(info.dim, int(dim)))
    d = stream_dim(info, bits=bits, dim=dim)
    # The whole file's labels at once: a chunk-wise check would accept {-1, 0, 1} in pieces.
    classes = binary_classes(info.labels, loss) if classes is None else tuple(classes)
    check_labels(np.asarray(info.labels, np.float64), loss, source=source, classes=classes)
    hashed = bits is not None and info.dim > d
    s = max(info.nnz if nnz is None else int(nnz), 1)
    if nnz is not None and not hashed and info.nnz > s:
        raise ValueError(f"an example has {info.nnz} non-zeros, more than nnz = {s}")
    bits = int(bits) if hashed else None
    return _Plan(info, d, s, bits, int(hash_seed), bool(constant), drop, classes)


def _to_csr(raw: _Raw, plan: _Plan) -> scipy.sparse.csr_matrix:
    """A raw block as a CSR matrix over the plan's ``d`` features (shifted, maybe hashed; with
    ``drop_unseen``, the features at ``d`` or beyond left out: they have no weight)."""
    indices = raw.indices if plan.info.zero_based else raw.indices - 1
    data, indptr = raw.data, raw.indptr
    if plan.bits is not None:
        indices = hash_any(indices, plan.bits, plan.seed)
    elif indices.size and indices.max() >= plan.dim:
        if not plan.drop_unseen:
            raise ValueError(f"a feature index {indices.max()} beyond dim = {plan.dim}")
        keep = indices < plan.dim
        indptr = np.concatenate([[0], np.cumsum(keep)])[indptr]
        indices, data = indices[keep], data[keep]
    shape = (raw.labels.shape[0], plan.dim)
    return scipy.sparse.csr_matrix((data, indices, indptr), shape=shape)


def _examples(x, labels, loss, plan: _Plan, dtype) -> SparseExamples:
    labels = check_labels(labels, loss, classes=plan.classes)
    examples = from_csr(x, labels, dim=plan.dim, nnz=plan.nnz, dtype=dtype)
    return with_constant(examples, plan.dim) if plan.constant else examples


def weights_dim(dim: int, constant: bool) -> int:
    """The learner's dimension for ``dim`` features: ``dim + 1`` with the constant feature."""
    return int(dim) + int(bool(constant))


def iter_svmlight(
    path,
    *,
    chunk_size: int = 4096,
    loss: str = "logistic",
    dim: int | None = None,
    bits: int | None = None,
    nnz: int | None = None,
    zero_based="auto",
    hash_seed: int = 0,
    chunk_bytes: int = 1 << 24,
    dtype=np.float32,
    info: SvmlightInfo | None = None,
    constant: bool = False,
    unseen: str = "error",
    classes: tuple[float, float] | None = None,
) -> Iterator[SparseExamples]:
    """The examples of the svmlight/LIBSVM file ``path`` in chunks of exactly ``chunk_size`` rows
    (the last one padded with rows whose ``mask`` is false), in constant memory.

    ``constant``: VW's constant feature, index ``d`` (value 1) in every example, so the chunks
    are over ``d + 1`` features (:func:`weights_dim`). ``unseen="drop"`` with ``dim`` given (a
    test file read with the training file's dimension): features at ``dim`` or beyond are left
    out, as features that have no weight; ``"error"`` (default) refuses them. ``classes``: the
    labels that mean ``-1`` and ``+1`` (:func:`~sketchopt.stream.examples.binary_classes`; by
    default the file's own two labels where they are neither ``{-1, +1}`` nor ``{0, 1}``, as
    LIBSVM's ``1/2`` files; a test file is read with its training file's).

    The file is scanned first (:func:`scan_svmlight`, skipped when ``info`` is given), so every
    error -- bad lines, labels outside the domain of ``loss`` -- is raised by this call, before
    the first chunk. The dimension is :func:`stream_dim` ``(info, bits, dim)``; ``nnz`` (the
    static number of non-zeros per row) defaults to the scan's; ``hash_seed`` seeds the hashing.
    Values are ``dtype``, labels mapped by :func:`~sketchopt.stream.examples.check_labels`.
    """
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    chunk_size = int(chunk_size)
    _check_zero_based(zero_based)
    if info is None:
        info = scan_svmlight(path, zero_based=zero_based, chunk_bytes=chunk_bytes)
    plan = _plan(
        info, loss=loss, dim=dim, bits=bits, nnz=nnz, zero_based=zero_based, hash_seed=hash_seed,
        constant=constant, unseen=unseen, source=path, classes=classes,
    )  # fmt: skip

    def chunks() -> Iterator[SparseExamples]:
        carry_x, carry_y = None, None
        for raw in _raw_blocks(path, chunk_bytes, one_based=not info.zero_based):
            x, y = _to_csr(raw, plan), raw.labels
            if carry_x is not None:
                x = scipy.sparse.vstack([carry_x, x], format="csr")
                y = np.concatenate([carry_y, y])
            full = x.shape[0] - x.shape[0] % chunk_size
            for start in range(0, full, chunk_size):
                stop = start + chunk_size
                yield _examples(x[start:stop], y[start:stop], loss, plan, dtype)
            carry_x, carry_y = x[full:], y[full:]
        if carry_x is not None and carry_x.shape[0]:
            last = _examples(carry_x, carry_y, loss, plan, dtype)
            yield pad_rows(last, chunk_size, weights_dim(plan.dim, plan.constant))

    return chunks()


def load_svmlight(
    path,
    *,
    loss: str = "logistic",
    dim: int | None = None,
    bits: int | None = None,
    nnz: int | None = None,
    zero_based="auto",
    hash_seed: int = 0,
    chunk_bytes: int = 1 << 24,
    dtype=np.float32,
    info: SvmlightInfo | None = None,
    constant: bool = False,
    unseen: str = "error",
    classes: tuple[float, float] | None = None,
) -> tuple[SparseExamples, int]:
    """The whole svmlight/LIBSVM file as one batch (no padding rows) and its dimension ``d``
    (``d + 1`` with ``constant``: the learner's); the options are :func:`iter_svmlight`'s.
    Reads the file once (the scan is made from the parsed blocks, which are all kept)."""
    _check_zero_based(zero_based)
    raws = list(_raw_blocks(path, chunk_bytes, one_based=zero_based is False))
    if info is None:
        scan = _Scan()
        for raw in raws:
            scan.add(raw)
        info = scan.info(zero_based)
    plan = _plan(
        info, loss=loss, dim=dim, bits=bits, nnz=nnz, zero_based=zero_based, hash_seed=hash_seed,
        constant=constant, unseen=unseen, source=path, classes=classes,
    )  # fmt: skip
    if not info.zero_based:
        for raw in raws:
            if raw.indices.size and raw.indices.min() == 0:
                raise ValueError(f"{os.fspath(path)}: feature index 0 in a one-based file")
    if raws:
        x = scipy.sparse.vstack([_to_csr(raw, plan) for raw in raws], format="csr")
        y = np.concatenate([raw.labels for raw in raws])
    else:
        x, y = scipy.sparse.csr_matrix((0, plan.dim)), np.zeros((0,))
    return _examples(x, y, loss, plan, dtype), weights_dim(plan.dim, plan.constant)


def _first_names(indices: np.ndarray, names) -> dict[int, str]:
    """``{index: name}``, the first of the names at each index (in their order)."""
    out: dict[int, str] = {}
    for index, name in zip(indices.tolist(), names, strict=True):
        out.setdefault(index, name)
    return out


def svmlight_feature_names(
    path, info: SvmlightInfo, *, bits: int | None = None, dim: int | None = None,
    hash_seed: int = 0, chunk_bytes: int = 1 << 24,
) -> dict[int, str]:  # fmt: skip
    """``{weight index: name}`` of the svmlight file ``path`` read as :func:`iter_svmlight`
    reads it with ``info``, ``bits`` and ``dim`` (shifted, hashed where it hashes): each name is
    the file's own index as written (``"1"`` for the first feature of a one-based file), the
    first one met in the file where hashed features collide."""
    d = stream_dim(info, bits=bits, dim=dim)
    hashed = bits is not None and info.dim > d
    seen: list[np.ndarray] = []
    for raw in _raw_blocks(path, chunk_bytes, one_based=not info.zero_based):
        if raw.indices.size:
            seen.append(raw.indices)
    if not seen:
        return {}
    order = np.concatenate(seen)
    raw_indices, first = np.unique(order, return_index=True)
    raw_indices = raw_indices[np.argsort(first, kind="stable")]  # the file's order
    indices = raw_indices if info.zero_based else raw_indices - 1
    if hashed:
        indices = hash_any(indices, int(bits), hash_seed)
    keep = indices < d
    return _first_names(indices[keep], (str(i) for i in raw_indices[keep].tolist()))


# --------------------------------------------------------------------------------------------
# Vowpal Wabbit's text format.


def _vw_lines(source) -> Iterator[str]:
    if isinstance(source, (str, os.PathLike)):
        with _open_binary(source) as f:
            for line in f:
                yield line.decode("utf-8")
    else:
        for line in source:
            yield line.decode("utf-8") if isinstance(line, bytes) else line


def _vw_float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} ({text!r}) is not a number") from None
    if not np.isfinite(value):
        raise ValueError(f"{what} ({text!r}) is not finite")
    return value


class _VwExample(NamedTuple):
    label: float
    weight: float  # the importance weight
    tag: str
    groups: dict[str, list[tuple[str, float]]]  # first letter of a namespace -> (name, value)


def _vw_example(line: str) -> _VwExample:
    """One VW line: ``label [importance] ['tag]|namespace[:scale] feature[:value] ...``."""
    header, bar, rest = line.partition("|")
    if not bar:
        raise ValueError("no '|': an example needs at least one namespace")
    words = header.split()
    tag = ""
    # The tag: the last word when it starts with a quote or touches the '|' (one word alone
    # touching it is read as the label here; VW would take it for a tag).
    if words and (words[-1].startswith("'") or (len(words) > 1 and not header[-1:].isspace())):
        tag = words.pop().removeprefix("'")
    if not words:
        raise ValueError("no label (unlabeled examples cannot be learned from)")
    if len(words) > 3:
        raise ValueError(f"cannot read the header {header.strip()!r}")
    label = _vw_float(words[0], "the label")
    weight = _vw_float(words[1], "the importance weight") if len(words) >= 2 else 1.0
    if weight < 0:
        raise ValueError(f"the importance weight ({words[1]}) is negative")
    if len(words) == 3:
        raise ValueError(f"a base (initial prediction) is not supported (got {words[2]})")
    groups: dict[str, list[tuple[str, float]]] = {}
    for section in rest.split("|"):
        # The namespace name touches the '|'; a space right after it is the default namespace.
        if section[:1].isspace() or not section:
            namespace, features = "", section.split()
        else:
            namespace, *features = section.split()
        scale = 1.0
        if ":" in namespace:
            namespace, _, text = namespace.rpartition(":")
            scale = _vw_float(text, f"the scale of namespace {namespace!r}")
        group = groups.setdefault(namespace[:1] or " ", [])
        group.extend(_vw_features_of(namespace, features, scale))
    return _VwExample(label, weight, tag, groups)


def _vw_features_of(namespace: str, features: list[str], scale: float):
    """The ``(namespace^name, scale * value)`` pairs of one namespace's feature words.

    The common form (every word ``name:value``) converts the values in one NumPy call, which
    reads the same numbers as Python's ``float``; anything else (a word without a value or a
    name, a value that is not a finite number) takes the word-by-word loop, which says which
    word is wrong."""
    parts = [feature.rpartition(":") for feature in features]
    if all(part[0] and part[1] for part in parts):
        try:
            values = np.asarray([part[2] for part in parts], np.float64)
        except ValueError:
            values = None
        if values is not None and np.isfinite(values).all():
            prefix = namespace + "^"
            return zip([prefix + part[0] for part in parts], (scale * values).tolist(), strict=True)
    out = []
    for feature in features:
        name, colon, text = feature.rpartition(":") if ":" in feature else (feature, "", "")
        if not name:
            raise ValueError(f"a feature without a name: {feature!r}")
        value = _vw_float(text, f"the value of feature {name!r}") if colon else 1.0
        out.append((f"{namespace}^{name}", scale * value))
    return out


def _vw_pairs(quadratic) -> list[tuple[str, str]]:
    if isinstance(quadratic, str):
        quadratic = [quadratic]
    pairs, seen = [], set()
    for q in quadratic:
        if not isinstance(q, str) or len(q) != 2:
            raise ValueError(f"a quadratic interaction is two namespace letters, got {q!r}")
        key = tuple(sorted(q))  # VW drops duplicate interactions: ab and ba are the same
        if key not in seen:
            seen.add(key)
            pairs.append((q[0], q[1]))
    return pairs


def _vw_entries(example: _VwExample, pairs, d: int):
    """The example's entries in namespace order (:mod:`sketchopt.stream.crosses`): each
    feature's plain index (``FeatureHasher``'s on its name), its 32-bit hash and its value, and
    each interaction's ``start_a, count_a, start_b, count_b``."""
    names, values, where = [], [], {}
    for letter, group in example.groups.items():
        where[letter] = (len(names), len(group))
        if group:
            group_names, group_values = zip(*group, strict=True)
            names.extend(group_names)
            values.extend(group_values)
    hashes = _name_hashes(names)
    spans = [(*where.get(a, (0, 0)), *where.get(b, (0, 0))) for a, b in pairs]
    return _hasher_index(hashes, d), hashes, np.asarray(values, np.float64), spans


# Names hashed so far (a stream's names recur: MNIST's 784 pixels in every example), bounded.
_HASHES: dict[str, int] = {}
_HASHES_MAX = 2**20


def _name_hashes(names) -> np.ndarray:
    """MurmurHash3 (seed 0) of each name's UTF-8 bytes, as uint32: the hashes that
    ``FeatureHasher`` reduces to indices and that the crosses combine. Remembered per name
    (forgotten at once when the memory would pass ``_HASHES_MAX`` names, and then refilled with
    this call's): a dictionary lookup costs a tenth of a call to the hash."""
    from sklearn.utils import murmurhash3_32

    known = _HASHES
    new = [n for n in names if n not in known]
    if new:
        if len(known) + len(new) > _HASHES_MAX:
            known.clear()
            new = names
        for name in new:
            known[name] = murmurhash3_32(name, seed=0, positive=True)
    return np.asarray([known[n] for n in names], np.uint32)


def _hasher_index(hashes: np.ndarray, d: int) -> np.ndarray:
    """``FeatureHasher``'s column of each uint32 hash: ``|h| mod d`` of the signed hash (its
    special case for ``-2**31`` included)."""
    signed = hashes.astype(np.int64)
    signed = np.where(signed >= 2**31, signed - 2**32, signed)
    special = (2**31 - 1 - (d - 1)) % d
    return np.where(signed == -(2**31), special, np.abs(signed) % d).astype(np.int64)


def _pair_positions(pair, span):
    """The positions, in an example's entries (:func:`_vw_entries`), of the two factors of each
    cross of namespaces ``pair = (a, b)`` whose entries ``span = (start_a, n_a, start_b, n_b)``
    holds: a namespace crossed with itself gives the unordered pairs ``i <= j`` (VW's default,
    the module docstring), two namespaces every ``(i, j)``."""
    (a, b), (start_a, n_a, start_b, n_b) = pair, span
    if a == b:
        i, j = np.triu_indices(n_a)
        return start_a + i, start_a + j
    return start_a + np.repeat(np.arange(n_a), n_b), start_b + np.tile(np.arange(n_b), n_a)


def _vw_crossed_row(example: _VwExample, pairs, d: int, bits: int):
    """One example's (column, value) pairs, its crosses included (duplicates not yet summed):
    the host's form of :mod:`sketchopt.stream.crosses`."""
    index, hashes, values, spans = _vw_entries(example, pairs, d)
    columns, products = [index], [values]
    for pair, span in zip(pairs, spans, strict=True):
        first, second = _pair_positions(pair, span)
        columns.append(cross_index(hashes[first], hashes[second], bits))
        products.append(values[first] * values[second])
    return np.concatenate(columns), np.concatenate(products)


def _vw_parsed(source, name: str) -> Iterator[_VwExample]:
    """The examples of ``source`` (blank lines skipped), a ``ValueError`` naming the file and the
    line for a bad one."""
    for number, line in enumerate(_vw_lines(source), 1):
        if not line.strip():
            continue
        try:
            yield _vw_example(line.rstrip("\r\n"))
        except ValueError as err:
            text = line.strip()
            text = text if len(text) <= 80 else text[:77] + "..."
            raise ValueError(f"{name}, line {number}: {err}: {text!r}") from None


def _vw_name(source) -> str:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else "VW input"


def _check_bits(bits) -> int:
    bits = int(bits)
    if not 1 <= bits <= 31:
        raise ValueError(f"bits must lie in [1, 31], got {bits}")
    return bits


def _vw_hashed(rows: list[dict], d: int) -> scipy.sparse.csr_matrix:
    from sklearn.feature_extraction import FeatureHasher

    if not rows:
        return scipy.sparse.csr_matrix((0, d))
    hasher = FeatureHasher(n_features=d, input_type="dict", alternate_sign=False, dtype=np.float64)
    return hasher.transform(rows)


def _vw_batch(
    parsed, pairs, bits, *, loss, nnz, dtype, constant, weighted, source=None, classes=None
) -> SparseExamples:
    """Parsed VW examples as one batch over ``2**bits`` hashed features: the crosses of
    ``pairs``, labels in the loss's domain, the importance weights (``weighted``) and the
    constant."""
    d = 2**bits
    if pairs:
        rows = [_vw_crossed_row(e, pairs, d, bits) for e in parsed]
        lengths = [len(c) for c, _ in rows]
        x = scipy.sparse.csr_matrix(
            (
                np.concatenate([v for _, v in rows] or [np.zeros(0)]),
                np.concatenate([c for c, _ in rows] or [np.zeros(0, np.int64)]),
                np.concatenate([[0], np.cumsum(lengths)]),
            ),
            shape=(len(parsed), d),
        )
        x.sum_duplicates()
    else:
        x = _vw_hashed([_vw_features(e) for e in parsed], d)
    labels = check_labels([e.label for e in parsed], loss, source=source, classes=classes)
    examples = from_csr(x, labels, dim=d, nnz=nnz, dtype=dtype)
    if weighted:
        examples = examples._replace(weights=np.asarray([e.weight for e in parsed], dtype))
    return with_constant(examples, d) if constant else examples


def _vw_features(example: _VwExample) -> dict[str, float]:
    """The example's features by name (repeats summed)."""
    pairs = [pair for group in example.groups.values() for pair in group]
    features = dict(pairs)
    if len(features) < len(pairs):  # a name repeats: its values are summed
        features = {}
        for name, value in pairs:
            features[name] = features.get(name, 0.0) + value
    return features


def _vw_crossed_chunk(parsed, pairs, layout: CrossLayout, *, loss, entries, dtype, constant,
                      weighted, chunk_size, classes=None) -> CrossedExamples:  # fmt: skip
    """Parsed VW examples as a :class:`CrossedExamples` chunk of ``chunk_size`` rows (the
    last ones padding), ``entries`` columns."""
    d = 2**layout.bits
    pad = layout.dim
    indices = np.full((chunk_size, entries), pad, np.int32)
    hashes = np.zeros((chunk_size, entries), np.uint32)
    values = np.zeros((chunk_size, entries), dtype)
    counts = np.zeros((chunk_size,), np.int32)
    spans = np.zeros((chunk_size, len(pairs), 4), np.int32)
    for n, example in enumerate(parsed):
        index, hash_, value, span = _vw_entries(example, pairs, d)
        k = len(index)
        indices[n, :k], hashes[n, :k], values[n, :k] = index, hash_, value
        if constant:
            indices[n, k], values[n, k] = d, 1
            k += 1
        counts[n], spans[n] = k, span
    labels = np.zeros((chunk_size,), dtype)
    labels[: len(parsed)] = check_labels([e.label for e in parsed], loss, classes=classes)
    mask = np.arange(chunk_size) < len(parsed)
    weights = None
    if weighted:
        weights = np.zeros((chunk_size,), dtype)
        weights[: len(parsed)] = [e.weight for e in parsed]
    return CrossedExamples(indices, hashes, values, counts, spans, labels, mask, layout, weights)


class VwInfo(NamedTuple):
    """What one pass over a VW text file found (:func:`scan_vw`)."""

    examples: int
    nnz: int  # most features of one example after the crosses (an upper bound: before hashing)
    labels: tuple  # sorted distinct label values, at most MAX_LABELS (the smallest)
    weighted: bool  # whether an importance weight other than 1 occurs
    entries: int = 0  # most features of one example before the crosses (repeats counted)
    total: int = 0  # the features of all examples after the crosses (the same bound)
    #: FeatureScales.normalized_norm over the features by name, times ``total`` over the
    #: features before the crosses (a cross's normalized square taken as one feature's)
    normalized_norm: float = 0.0


def _pair_count(example: _VwExample, pairs) -> int:
    sizes = {k: len(v) for k, v in example.groups.items()}
    total = sum(sizes.values())
    for a, b in pairs:
        na, nb = sizes.get(a, 0), sizes.get(b, 0)
        total += na * (na + 1) // 2 if a == b else na * nb
    return total


def scan_vw(source, *, quadratic: Iterable[str] = ()) -> VwInfo:
    """One pass over VW text (a path or lines) in constant memory: every line validated (a
    ``ValueError`` naming the file and the line), the examples counted, the static bound on
    their features (with ``quadratic``'s crosses) and the labels found."""
    pairs = _vw_pairs(quadratic)
    examples, nnz, weighted, labels, entries, total = 0, 0, False, set(), 0, 0
    scales, names, values, batch, base = FeatureScales(), [], [], 0, 0
    for example in _vw_parsed(source, _vw_name(source)):
        examples += 1
        count = _pair_count(example, pairs)
        nnz, total = max(nnz, count), total + count
        features = [f for group in example.groups.values() for f in group]
        entries, base = max(entries, len(features)), base + len(features)
        weighted = weighted or example.weight != 1.0
        if len(labels) < MAX_LABELS:
            labels.add(example.label)
        names.extend(name for name, _ in features)
        values.extend(value for _, value in features)
        batch += 1
        if len(names) >= _SCALES_BATCH:
            scales.add(_name_hashes(names), values, batch)
            names, values, batch = [], [], 0
    scales.add(_name_hashes(names), values, batch)
    norm = scales.normalized_norm() * (total / base if base else 1.0)
    return VwInfo(examples, nnz, tuple(sorted(labels)), weighted, entries, total, norm)


#: Features per :meth:`FeatureScales.add` call of :func:`scan_vw`.
_SCALES_BATCH = 1 << 16


def cross_layout(info: VwInfo, quadratic, bits: int, *, constant: bool, width: int | None = None):
    """The :class:`~sketchopt.stream.crosses.CrossLayout` of a VW file's crossed chunks: the
    segment ``width`` (default: the power of two nearest a quarter of the mean example length,
    64 to 2048: on the crossed MNIST stream, 12k features on average, ``ada_diag`` ran at 1.5k
    examples/s with segments of 8192, 2.4-2.6k with 1024-2048, 2.0k with 512; each segment's
    gathered rows must stay in the cache) and a buffer for the longest example."""
    pairs = _vw_pairs(quadratic)
    longest = info.nnz + int(constant)
    if width is None:
        mean = max((info.total + info.examples * int(constant)) / max(info.examples, 1), 1.0)
        width = int(min(max(1 << int(round(np.log2(max(mean / 4, 1)))), 64), 2048))
    capacity = max(-(-longest // width), 1) * width
    square = tuple(a == b for a, b in pairs)
    dim = weights_dim(2**bits, constant)
    return CrossLayout(dim, int(bits), square, int(width), int(capacity))


def detect_format(path) -> str:
    """``"vw"`` when the first example line of ``path`` holds a ``|`` (VW's text format), else
    ``"svmlight"`` (LIBSVM/svmlight); blank lines and ``#`` comments are passed over."""
    with _open_binary(path) as f:
        for line in f:
            text = line.strip()
            if text and not text.startswith(b"#"):
                return "vw" if b"|" in text else "svmlight"
    return "svmlight"


def iter_vw(
    source,
    *,
    chunk_size: int = 4096,
    bits: int = 18,
    quadratic: Iterable[str] = (),
    loss: str = "logistic",
    constant: bool = False,
    nnz: int | None = None,
    dtype=np.float32,
    info: VwInfo | None = None,
    crosses: str = "host",
    width: int | None = None,
    classes: tuple[float, float] | None = None,
) -> Iterator[SparseExamples | CrossedExamples]:
    """The examples of VW text (a path, ``.gz``/``.bz2`` read compressed, or lines) in chunks of
    exactly ``chunk_size`` rows (the last padded), in constant memory: :func:`read_vw`'s
    features (hashed into ``2**bits``; ``quadratic``'s crosses), ``constant`` VW's constant
    feature at index ``2**bits`` (so ``2**bits + 1`` features, :func:`weights_dim`), and the
    importance weights in the chunks' ``weights`` (``None`` where every weight is 1). The source
    is scanned first (:func:`scan_vw`, unless ``info`` is given: it must be read twice), so bad
    lines and labels outside the loss's domain fail before the first chunk.

    ``crosses="device"`` (with ``quadratic``) yields
    :class:`~sketchopt.stream.crosses.CrossedExamples` instead: each example's own features
    only, its crosses built inside the compiled step (the same vectors as ``"host"``, which
    stores them; ``width`` the segment width, :func:`cross_layout`). The command line reads so.
    ``classes`` as in :func:`iter_svmlight`."""
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    chunk_size, bits = int(chunk_size), _check_bits(bits)
    pairs = _vw_pairs(quadratic)
    info = scan_vw(source, quadratic=quadratic) if info is None else info
    name = _vw_name(source)
    classes = binary_classes(info.labels, loss) if classes is None else tuple(classes)
    # the whole file's labels, once
    check_labels(np.asarray(info.labels, np.float64), loss, source=name, classes=classes)
    if crosses not in ("host", "device"):
        raise ValueError(f"crosses must be 'host' or 'device', got {crosses!r}")
    d = 2**bits
    padded = max(info.nnz if nnz is None else int(nnz), 1)
    layout = None
    if crosses == "device" and pairs:
        layout = cross_layout(info, quadratic, bits, constant=constant, width=width)

    def chunk(parsed: list[_VwExample]) -> SparseExamples | CrossedExamples:
        if layout is not None:
            return _vw_crossed_chunk(
                parsed, pairs, layout, loss=loss, entries=max(info.entries + int(constant), 1),
                dtype=dtype, constant=constant, weighted=info.weighted, chunk_size=chunk_size,
                classes=classes,
            )  # fmt: skip
        examples = _vw_batch(
            parsed, pairs, bits, loss=loss, nnz=padded, dtype=dtype, constant=constant,
            weighted=info.weighted, classes=classes,
        )  # fmt: skip
        return pad_rows(examples, chunk_size, weights_dim(d, constant))

    def chunks() -> Iterator[SparseExamples]:
        block: list[_VwExample] = []
        for example in _vw_parsed(source, name):
            block.append(example)
            if len(block) == chunk_size:
                yield chunk(block)
                block = []
        if block:
            yield chunk(block)

    return chunks()


def read_vw(
    source,
    *,
    bits: int = 18,
    quadratic: Iterable[str] = (),
    loss: str = "logistic",
    nnz: int | None = None,
    dtype=np.float32,
    constant: bool = False,
    classes: tuple[float, float] | None = None,
) -> tuple[SparseExamples, int]:
    """The examples of Vowpal Wabbit's text format as one batch, and their dimension ``2**bits``
    (``2**bits + 1`` with ``constant``, VW's constant feature; :func:`iter_vw` reads the same in
    chunks, in constant memory).

    ``source`` is a path (``.gz``/``.bz2`` read compressed) or an iterable of lines, each
    ``label [importance] ['tag]|namespace[:scale] feature[:value] ... |other ...``: a namespace's
    name touches its ``|`` (none: the default namespace), a feature without ``:value`` has value
    1, ``:scale`` multiplies the namespace's values. Blank lines are skipped; a missing label, a
    negative importance weight or a base (a third header word) raise ``ValueError`` naming the
    line. Importance weights other than 1 land in the batch's ``weights``; tags are read and
    dropped. Labels ``-1/1`` or ``0/1`` (mapped to ``-1/1``) for the classification losses, or
    any other two (``classes``, :func:`iter_svmlight`'s).

    **Hashing** (not VW's own: the indices differ, which does not matter for learning, only which
    features collide): scikit-learn's ``FeatureHasher`` (MurmurHash3, ``2**bits`` columns, no
    alternating sign) on the names ``"namespace^feature"``; the same feature twice in an example
    is summed. ``quadratic``: VW's ``-q`` pairs of namespace letters (``"ab"``; a space is the
    default namespace): the features of the namespaces starting with ``a`` crossed with those
    starting with ``b``, value the product, at VW's index of a quadratic feature computed from
    the two names' 32-bit MurmurHash3 (:func:`sketchopt.stream.crosses.cross_index`). A letter
    crossed with itself gives the pairs ``i <= j`` in the example's order (VW's default; see the
    module docstring), and ``ab`` with ``ba`` is generated once (VW drops duplicate
    interactions).
    """
    bits = _check_bits(bits)
    pairs = _vw_pairs(quadratic)
    name = _vw_name(source)
    parsed = list(_vw_parsed(source, name))
    d = 2**bits
    if classes is None:
        classes = binary_classes([e.label for e in parsed], loss)
    examples = _vw_batch(
        parsed, pairs, bits, loss=loss, nnz=nnz, dtype=dtype, constant=constant,
        weighted=any(e.weight != 1.0 for e in parsed), source=name, classes=classes,
    )  # fmt: skip
    return examples, weights_dim(d, constant)


def _vw_display(name: str) -> str:
    """A feature's name as VW writes it: ``namespace^feature``, the default namespace's bare."""
    return name[1:] if name.startswith("^") else name


def vw_tags(source) -> Iterator[str]:
    """Each example's tag of VW text (``""`` where it has none), in the stream's order: VW's
    ``-p`` writes it after the prediction."""
    for example in _vw_parsed(source, _vw_name(source)):
        yield example.tag


def vw_feature_names(source, *, bits: int = 18, quadratic: Iterable[str] = ()) -> dict[int, str]:
    """``{weight index: name}`` of VW text read as :func:`read_vw` and :func:`iter_vw` read it
    (``bits``, ``quadratic``): VW's names, ``namespace^feature`` (a default-namespace feature by
    its bare name) and ``a^x*b^y`` for a cross, the first met in the stream where features
    collide (as VW's ``--invert_hash`` keeps one name per index). The constant is not named here
    (the command line adds VW's ``Constant``)."""
    bits = _check_bits(bits)
    pairs = _vw_pairs(quadratic)
    d = 2**bits
    out: dict[int, str] = {}
    for example in _vw_parsed(source, _vw_name(source)):
        names = [_vw_display(n) for group in example.groups.values() for n, _ in group]
        index, hashes, _, spans = _vw_entries(example, pairs, d)
        out.update((i, n) for i, n in zip(index.tolist(), names, strict=True) if i not in out)
        for pair, span in zip(pairs, spans, strict=True):
            first, second = _pair_positions(pair, span)
            crossed = cross_index(hashes[first], hashes[second], bits).tolist()
            for k, f, g in zip(crossed, first.tolist(), second.tolist(), strict=True):
                if k not in out:
                    out[k] = f"{names[f]}*{names[g]}"
    return out


# --------------------------------------------------------------------------------------------
# Quadratic crosses of numeric features.


def cross_features(matrix, bits: int, *, seed: int = 0, max_pairs: int = 1 << 22):
    """The quadratic crosses of each row of ``matrix`` (``n x dim``, SciPy sparse or dense), as
    an ``n x 2**bits`` CSR matrix: VW's ``-q aa`` on one namespace of numeric features.

    Row ``r``'s crosses are the pairs ``i <= j`` of its non-zero features (the squares
    included, as VW generates them), with value ``x_i x_j`` at the column
    :func:`~sketchopt.stream.examples.hash_indices` ``(i * dim + j, bits, seed)``; colliding pairs
    are summed. The original features are not included (``scipy.sparse.hstack`` them, or hash them
    beside). A row of ``k`` non-zeros makes ``k (k + 1) / 2`` pairs; they are generated vectorized
    over blocks of rows of at most ``max_pairs`` pairs in all (one row at least). Needs
    ``dim**2 <= 2**31`` (the key is hashed as a 32-bit integer), e.g. ``dim = 784`` for MNIST.
    """
    bits = int(bits)
    if not 1 <= bits <= 31:
        raise ValueError(f"bits must lie in [1, 31], got {bits}")
    x = scipy.sparse.csr_matrix(matrix, dtype=np.float64, copy=True)
    x.sum_duplicates()  # also sorts the indices of each row: i <= j below
    x.eliminate_zeros()
    if x.nnz and not np.all(np.isfinite(x.data)):
        raise ValueError("non-finite feature values")
    n, dim = x.shape
    if dim * dim > 2**31:
        raise ValueError(f"crosses need dim**2 <= 2**31 (dim <= 46340), got dim = {dim}")
    counts = np.diff(x.indptr)
    pairs_per_row = counts * (counts + 1) // 2
    cumulative = np.concatenate([[0], np.cumsum(pairs_per_row)])
    out, start = [], 0
    while True:
        stop = int(np.searchsorted(cumulative, cumulative[start] + max_pairs, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        out.append(_cross_rows(x, start, stop, bits, seed))
        start = stop
        if start >= n:
            break
    return scipy.sparse.vstack(out, format="csr") if len(out) > 1 else out[0]


def _cross_rows(x, start: int, stop: int, bits: int, seed: int):
    """The crosses of rows ``[start, stop)`` of the canonical CSR matrix ``x``."""
    dim = x.shape[1]
    first, last = x.indptr[start], x.indptr[stop]
    position = np.arange(first, last)
    row = np.repeat(np.arange(start, stop), np.diff(x.indptr[start : stop + 1]))
    partners = x.indptr[row + 1] - position  # itself and the entries after it in its row
    total = int(partners.sum())
    left = np.repeat(position, partners)
    offset = np.arange(total) - np.repeat(np.cumsum(partners) - partners, partners)
    right = left + offset
    keys = x.indices[left].astype(np.int64) * dim + x.indices[right]
    columns = hash_indices(keys, bits, seed)
    values = x.data[left] * x.data[right]
    crosses = scipy.sparse.csr_matrix(
        (values, (np.repeat(row, partners) - start, columns)), shape=(stop - start, 2**bits)
    )
    crosses.sum_duplicates()
    crosses.eliminate_zeros()
    return crosses


def hash_pairs(indices, values, bits: int, *, dim: int, seed: int = 0):
    """The crosses of one example ``(indices, values)`` over ``dim`` features, as sorted
    ``(indices, values)`` arrays (:func:`cross_features` of a one-row matrix)."""
    indices = np.asarray(indices, np.int64).reshape(-1)
    values = np.asarray(values, np.float64).reshape(-1)
    row = scipy.sparse.csr_matrix(
        (values, indices, np.array([0, indices.size])), shape=(1, int(dim))
    )
    crosses = cross_features(row, bits, seed=seed)
    return np.asarray(crosses.indices, np.int64), np.asarray(crosses.data)
