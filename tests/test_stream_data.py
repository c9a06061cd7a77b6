"""Tests of sketchopt.stream.data: svmlight files in chunks, VW's text format, crosses.

References are independent of the module: scikit-learn's whole-file ``load_svmlight_file``, dense
NumPy rows built by ``np.add.at``, and brute-force loops.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import scipy.sparse
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from sketchopt.stream import crosses, data
from sketchopt.stream.data import (
    MAX_LABELS,
    SvmlightInfo,
    cross_features,
    hash_pairs,
    iter_svmlight,
    load_svmlight,
    read_vw,
    scan_svmlight,
    stream_dim,
)
from sketchopt.stream.examples import binary_classes, hash_indices, to_dense

# --------------------------------------------------------------------------------------------
# Helpers.


def random_data(n=150, d=40, density=0.15, seed=0, labels=(-1.0, 1.0)):
    """A random sparse matrix with some empty rows, the first column used by the last row only,
    some rows long (many non-zeros), and labels drawn from ``labels``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * (rng.random((n, d)) < density)
    x[::11] = 0.0  # empty examples
    x[5] = rng.normal(size=d)  # a long line
    x[:, 0] = 0.0
    x[-1, 0] = 2.5  # the only index 0 of a zero-based file: in its last line
    y = rng.choice(np.asarray(labels), size=n)
    return x, y


def write(path, x, y, zero_based):
    dump_svmlight_file(scipy.sparse.csr_matrix(x), y, str(path), zero_based=zero_based)
    return path


def collect(chunks, d, chunk_size):
    """Dense rows and labels of the unmasked rows of ``chunks``; checks the chunks' shapes and
    padding on the way."""
    rows, labels, seen_padding = [], [], False
    for chunk in chunks:
        indices, values = np.asarray(chunk.indices), np.asarray(chunk.values)
        mask = np.asarray(chunk.mask)
        assert chunk.labels.shape == (chunk_size,)
        assert not seen_padding, "only the last chunk may hold padding rows"
        if not mask.all():
            seen_padding = True
            first = int(np.argmin(mask))
            assert mask[:first].all() and not mask[first:].any()
            assert np.all(indices[~mask] == d) and np.all(values[~mask] == 0)
        rows.append(to_dense(chunk, d)[mask])
        labels.append(np.asarray(chunk.labels)[mask])
    return np.concatenate(rows), np.concatenate(labels)


# --------------------------------------------------------------------------------------------
# svmlight files.


@pytest.mark.parametrize("zero_based", [False, True])
def test_chunks_equal_the_whole_file(tmp_path, zero_based):
    x, y = random_data()
    path = write(tmp_path / "data.svm", x, y, zero_based)
    ref_x, ref_y = load_svmlight_file(path, zero_based=zero_based)
    ref = ref_x.toarray()
    np.testing.assert_allclose(ref, x)
    info = scan_svmlight(path, chunk_bytes=53)
    assert info == scan_svmlight(path)
    assert info.examples == x.shape[0] and info.zero_based == zero_based
    assert info.labels == (-1.0, 1.0)
    assert info.nnz == int((x != 0).sum(axis=1).max())
    assert info.dim == x.shape[1]
    d = stream_dim(info)
    for chunk_size in (1, 7, 64, 150, 500):
        for chunk_bytes in (13, 97, 1 << 24):  # 13 bytes: every line straddles several blocks
            chunks = iter_svmlight(path, chunk_size=chunk_size, chunk_bytes=chunk_bytes)
            dense, labels = collect(chunks, d, chunk_size)
            np.testing.assert_allclose(dense, ref, rtol=1e-6)
            np.testing.assert_array_equal(labels, ref_y)
    whole, d_whole = load_svmlight(path, chunk_bytes=31)
    assert d_whole == d and whole.labels.shape == (x.shape[0],) and np.all(whole.mask)
    np.testing.assert_allclose(to_dense(whole, d), ref, rtol=1e-6)
    np.testing.assert_array_equal(whole.labels, ref_y)


def test_zero_based_resolved_over_the_whole_file(tmp_path):
    """Index 0 only in the last line: every block must still be read zero-based (scikit-learn's
    per-call "auto" would shift the earlier blocks)."""
    x, y = random_data(n=60)
    path = write(tmp_path / "zero.svm", x, y, zero_based=True)
    assert scan_svmlight(path, chunk_bytes=20).zero_based
    dense, _ = collect(iter_svmlight(path, chunk_size=8, chunk_bytes=20), x.shape[1], 8)
    np.testing.assert_allclose(dense, x, rtol=1e-6)
    # Read as one-based on request: an error, since index 0 occurs.
    with pytest.raises(ValueError, match=r"line 60: feature index 0 .*one-based"):
        scan_svmlight(path, zero_based=False, chunk_bytes=20)
    # A one-based file read as zero-based on request: column 0 stays empty.
    path1 = write(tmp_path / "one.svm", x, y, zero_based=False)
    info = scan_svmlight(path1, zero_based=True)
    assert not scan_svmlight(path1).zero_based and info.dim == x.shape[1] + 1
    dense, _ = collect(iter_svmlight(path1, chunk_size=16, info=info), info.dim, 16)
    np.testing.assert_allclose(dense[:, 1:], x, rtol=1e-6)
    assert not dense[:, 0].any()


def test_last_chunk_padding_is_masked(tmp_path):
    x, y = random_data(n=10, d=6, density=0.5)
    path = write(tmp_path / "small.svm", x, y, zero_based=True)
    chunks = list(iter_svmlight(path, chunk_size=4, nnz=9))
    assert len(chunks) == 3
    last = chunks[-1]
    assert last.indices.shape == (4, 9) and last.indices.dtype == np.int32
    np.testing.assert_array_equal(last.mask, [True, True, False, False])
    np.testing.assert_array_equal(last.indices[2:], 6)
    np.testing.assert_array_equal(last.values[2:], 0.0)
    assert all(c.mask.all() for c in chunks[:-1])
    assert last.values.dtype == np.float32
    # nnz smaller than the data's: an error at once, not mid-stream.
    with pytest.raises(ValueError, match="more than nnz"):
        iter_svmlight(path, chunk_size=4, nnz=1)


def test_empty_examples_comments_and_blank_lines(tmp_path):
    path = tmp_path / "empty.svm"
    path.write_text("1\n# a comment line\n\n-1 2:1.5 4:-2 # trailing comment\n1 qid:3\n-1 1:1\n")
    info = scan_svmlight(path)
    assert info.examples == 4 and info.dim == 4 and info.nnz == 2 and not info.zero_based
    (chunk,) = iter_svmlight(path, chunk_size=4)
    np.testing.assert_array_equal(chunk.mask, True)
    np.testing.assert_array_equal(
        to_dense(chunk, 4), [[0, 0, 0, 0], [0, 1.5, 0, -2], [0, 0, 0, 0], [1, 0, 0, 0]]
    )
    np.testing.assert_array_equal(chunk.labels, [1, -1, 1, -1])


def test_crlf_and_no_final_newline(tmp_path):
    path = tmp_path / "crlf.svm"
    path.write_bytes(b"1 1:1 3:2\r\n-1 2:0.5\r\n1 1:-1 2:4 3:1")
    for chunk_bytes in (1, 5, 1 << 24):
        (chunk,) = iter_svmlight(path, chunk_size=3, chunk_bytes=chunk_bytes)
        np.testing.assert_array_equal(to_dense(chunk, 3), [[1, 0, 2], [0, 0.5, 0], [-1, 4, 1]])
        np.testing.assert_array_equal(chunk.labels, [1, -1, 1])


def test_hashing_sums_collisions(tmp_path):
    x, y = random_data(n=80, d=300, density=0.1)
    path = write(tmp_path / "wide.svm", x, y, zero_based=True)
    info = scan_svmlight(path)
    bits = 5
    d = stream_dim(info, bits=bits)
    assert d == 32
    rows, cols = np.nonzero(x)
    columns = hash_indices(cols, bits, seed=7)
    assert len(np.unique(columns)) < len(np.unique(cols))  # collisions do occur
    expected = np.zeros((x.shape[0], d))
    np.add.at(expected, (rows, columns), x[rows, cols])
    dense, _ = collect(iter_svmlight(path, chunk_size=16, bits=bits, hash_seed=7), d, 16)
    np.testing.assert_allclose(dense, expected, rtol=1e-5, atol=1e-6)
    batch, d_batch = load_svmlight(path, bits=bits, hash_seed=7)
    assert d_batch == d and np.all((np.asarray(batch.indices) < d) | (batch.values == 0))
    np.testing.assert_allclose(to_dense(batch, d), expected, rtol=1e-5, atol=1e-6)
    # Each example's hashed indices are distinct (collisions within an example summed).
    for row in np.asarray(batch.indices):
        real = row[row < d]
        assert len(np.unique(real)) == len(real)
    # bits larger than the data: kept as they are, in a dimension of 2**bits.
    dense, _ = collect(iter_svmlight(path, chunk_size=32, bits=9), 512, 32)
    np.testing.assert_allclose(dense[:, :300], x, rtol=1e-6)
    assert not dense[:, 300:].any()


def test_stream_dim_rules():
    info = SvmlightInfo(examples=3, dim=100, nnz=4, zero_based=True, labels=(-1.0, 1.0))
    assert stream_dim(info) == 100
    assert stream_dim(info, dim=128) == 128
    assert stream_dim(info, bits=4) == 16
    assert stream_dim(info, bits=10) == 1024
    assert stream_dim(info, bits=7, dim=128) == 128
    assert stream_dim(info._replace(dim=0)) == 1
    with pytest.raises(ValueError, match="more than dim"):
        stream_dim(info, dim=50)
    with pytest.raises(ValueError, match="contradicts"):
        stream_dim(info, bits=4, dim=100)
    with pytest.raises(ValueError, match="bits"):
        stream_dim(info, bits=0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1 1:1\n-1 -3:2\n", r"line 2: cannot parse it \(Invalid index -3"),
        ("1 1:1\n1 2:nan\n", r"line 2: a non-finite feature value"),
        ("1 1:1\n-1 2:inf\n", r"line 2: a non-finite feature value"),
        ("1 1:1\nnan 2:1\n", r"line 2: a non-finite label"),
        ("1 3:1 2:1\n", r"line 1: cannot parse it \(.*sorted and unique"),
        ("1 2:1 2:1\n", r"line 1: cannot parse it \(.*sorted and unique"),
        ("1 2:x\n", r"line 1: cannot parse it"),
        # a 64-bit index is read (and hashed with bits), by the same rules
        ("1 1:1\n1 4000000000:1 5:1\n", r"line 2: cannot parse it \(.*sorted and unique"),
    ],
)
def test_bad_lines_are_errors_with_line_numbers(tmp_path, text, match):
    path = tmp_path / "bad.svm"
    path.write_text(text)
    for chunk_bytes in (4, 1 << 24):
        with pytest.raises(ValueError, match=match):
            scan_svmlight(path, chunk_bytes=chunk_bytes)
        with pytest.raises(ValueError, match=match):
            iter_svmlight(path, chunk_bytes=chunk_bytes)  # raised by the call, not the first next
        with pytest.raises(ValueError, match=match):
            load_svmlight(path, chunk_bytes=chunk_bytes)


def test_labels_checked_for_the_loss(tmp_path):
    x, y = random_data(n=30, labels=(0.0, 1.0))
    path = write(tmp_path / "01.svm", x, y, zero_based=True)
    batch, _ = load_svmlight(path)
    np.testing.assert_array_equal(batch.labels, np.where(y > 0, 1.0, -1.0))
    dense, labels = collect(iter_svmlight(path, chunk_size=4), 40, 4)  # chunks of one class too
    np.testing.assert_array_equal(labels, np.where(y > 0, 1.0, -1.0))
    # squared loss: labels as they are
    batch, _ = load_svmlight(path, loss="squared")
    np.testing.assert_array_equal(batch.labels, y)
    # label 2 with the logistic loss
    path2 = tmp_path / "two.svm"
    path2.write_text("1 1:1\n2 2:1\n-1 1:1\n")
    with pytest.raises(ValueError, match=r"logistic loss takes labels .* found \[2.0\]"):
        iter_svmlight(path2)
    assert load_svmlight(path2, loss="squared")[0].labels.shape == (3,)
    # {-1, 0, 1}: invalid as a whole, although chunks of {0, 1} and {-1, 1} would each pass.
    path3 = tmp_path / "three.svm"
    path3.write_text("0 1:1\n1 1:1\n-1 1:1\n1 1:1\n")
    with pytest.raises(ValueError, match=r"three\.svm: the hinge loss"):  # names the file
        iter_svmlight(path3, chunk_size=2, loss="hinge")
    vw_file = tmp_path / "three.vw"
    vw_file.write_text("0 |f a\n1 |f b\n-1 |f a b\n")
    with pytest.raises(ValueError, match=r"three\.vw: the logistic loss .* found \[0\.0\]"):
        list(data.iter_vw(vw_file))
    with pytest.raises(ValueError, match=r"three\.vw: the logistic loss"):
        data.read_vw(vw_file)


def test_two_other_labels_are_the_two_classes(tmp_path):
    """LIBSVM's ``1/2`` (mushrooms, covtype.binary) and ``2/4`` (breast-cancer) binary files:
    the smaller label is -1, whatever the file's order and in chunks holding one class only; a
    file read with another file's pair refuses a third label; the squared loss and the usual
    conventions keep their own reading."""
    assert binary_classes([2.0, 4.0, 2.0], "logistic") == (2.0, 4.0)
    for labels in ([-1.0, 1.0], [0.0, 1.0], [1.0], [1.0, 2.0, 3.0], [0.0, -1.0]):
        assert binary_classes(labels, "hinge") is None
    assert binary_classes([1.0, 2.0], "squared") is None
    path = tmp_path / "mushrooms.svm"
    path.write_text("2 1:1\n2 2:1\n1 1:1 3:2\n2 3:1\n1 2:1\n")
    expected = [1.0, 1.0, -1.0, 1.0, -1.0]
    np.testing.assert_array_equal(load_svmlight(path)[0].labels, expected)
    _, labels = collect(iter_svmlight(path, chunk_size=2), 3, 2)
    np.testing.assert_array_equal(labels[:5], expected)
    test = tmp_path / "test.svm"
    test.write_text("1 1:1\n1 2:1\n")  # one class only: read with the training file's pair
    batch, _ = load_svmlight(test, classes=(1.0, 2.0))
    np.testing.assert_array_equal(batch.labels, [-1.0, -1.0])
    test.write_text("1 1:1\n4 2:1\n")
    with pytest.raises(ValueError, match=r"test\.svm: labels must be the classes 1 \(-1\) and 2"):
        iter_svmlight(test, classes=(1.0, 2.0))
    assert load_svmlight(path, loss="squared")[0].labels.tolist() == [2, 2, 1, 2, 1]
    vw_file = tmp_path / "two.vw"
    vw_file.write_text("4 |f a\n2 |f b\n4 |f a b\n")
    np.testing.assert_array_equal(data.read_vw(vw_file)[0].labels, [1.0, -1.0, 1.0])
    chunk = next(data.iter_vw(vw_file, chunk_size=2, quadratic=["ff"], crosses="device"))
    np.testing.assert_array_equal(chunk.labels, [1.0, -1.0])


def test_many_labels_kept_bounded(tmp_path):
    n = MAX_LABELS + 50
    x = np.ones((n, 1))
    y = np.arange(n, dtype=float)[::-1]
    path = write(tmp_path / "reg.svm", x, y, zero_based=False)
    info = scan_svmlight(path, chunk_bytes=1000)
    assert info.labels == tuple(float(v) for v in range(MAX_LABELS))
    with pytest.raises(ValueError, match="logistic"):
        iter_svmlight(path, info=info)
    dense, labels = collect(iter_svmlight(path, loss="squared", chunk_size=100), 1, 100)
    np.testing.assert_array_equal(labels, y)


def test_compressed_file(tmp_path):
    x, y = random_data(n=40)
    path = tmp_path / "data.svm.gz"
    with gzip.open(path, "wb") as f:
        dump_svmlight_file(scipy.sparse.csr_matrix(x), y, f, zero_based=True)
    info = scan_svmlight(path, chunk_bytes=64)
    assert info.examples == 40 and info.zero_based
    dense, labels = collect(iter_svmlight(path, chunk_size=16, chunk_bytes=64), 40, 16)
    np.testing.assert_allclose(dense, x, rtol=1e-6)
    np.testing.assert_array_equal(labels, y)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.svm"
    path.write_text("")
    info = scan_svmlight(path)
    assert info.examples == 0 and info.dim == 0 and info.labels == ()
    assert list(iter_svmlight(path)) == []
    batch, d = load_svmlight(path)
    assert batch.labels.shape == (0,) and batch.indices.shape == (0, 1) and d == 1


# --------------------------------------------------------------------------------------------
# VW's text format.


def vw_column(name, bits):
    """The column ``FeatureHasher`` gives the feature name ``name`` (a one-feature reference)."""
    from sklearn.feature_extraction import FeatureHasher

    hasher = FeatureHasher(n_features=2**bits, input_type="dict", alternate_sign=False)
    return int(hasher.transform([{name: 1.0}]).indices[0])


def vw_expected(rows, bits):
    d = 2**bits
    out = np.zeros((len(rows), d))
    for r, features in enumerate(rows):
        for name, value in features.items():
            out[r, vw_column(name, bits)] += value
    return out


def test_read_vw_features_namespaces_and_values():
    lines = [
        "1 |a x y:2.5 |b z:-1\n",
        "-1 1.0 'ex2|a x:0.5 x |c:2 w:3 v\n",  # importance 1, a tag, a repeated feature, a scale
        "-1 tag3| plain:4 other\n",  # a tag touching '|', the default namespace
        "\n",
        "1 |a\n",  # an example without features
    ]
    batch, d = read_vw(lines, bits=20)
    assert d == 2**20
    expected = vw_expected(
        [
            {"a^x": 1, "a^y": 2.5, "b^z": -1},
            {"a^x": 1.5, "c^w": 6, "c^v": 2},
            {"^plain": 4, "^other": 1},
            {},
        ],
        20,
    )
    np.testing.assert_allclose(to_dense(batch, d), expected)
    np.testing.assert_array_equal(batch.labels, [1, -1, -1, 1])
    np.testing.assert_array_equal(batch.mask, True)


def cross_column(first: str, second: str, bits: int) -> int:
    """The column of the cross of two named features, written out from its definition
    (:func:`sketchopt.stream.crosses.cross_index`): VW's ``(h1 * 16777619) ^ h2`` of the names'
    MurmurHash3, MurmurHash3's finalizer, the mask."""
    from sklearn.utils import murmurhash3_32

    h1, h2 = (murmurhash3_32(n, seed=0, positive=True) for n in (first, second))
    h = ((h1 * 16777619) % 2**32) ^ h2
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) % 2**32
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) % 2**32
    return (h ^ (h >> 16)) % 2**bits


def crossed_expected(plain: dict, crosses: list, bits: int) -> np.ndarray:
    """One row: ``plain`` features by name, ``crosses`` ``(name, name, value)`` triples."""
    row = vw_expected([plain], bits)[0]
    for first, second, value in crosses:
        row[cross_column(first, second, bits)] += value
    return row


def test_read_vw_quadratic():
    lines = ["1 |user u1 u2:2 |url site:3 |item i1:0.5 |b k\n", "-1 |item i2\n"]
    batch, d = read_vw(lines, bits=22, quadratic=["ui", "iu", "uu"])
    u = [("user^u1", 1.0), ("user^u2", 2.0), ("url^site", 3.0)]  # namespaces starting with u
    plain = dict(u + [("item^i1", 0.5), ("b^k", 1.0)])
    pairs = [(name, "item^i1", value * 0.5) for name, value in u]  # ui (iu: the same, once)
    for i, (name, value) in enumerate(u):  # uu: pairs i <= j, squares included
        pairs += [(name, other, value * other_value) for other, other_value in u[i:]]
    first = crossed_expected(plain, pairs, 22)
    second = vw_expected([{"item^i2": 1.0}], 22)[0]  # no u namespace: no crosses
    np.testing.assert_allclose(to_dense(batch, d), np.stack([first, second]))
    assert int(np.asarray(batch.mask).sum()) == 2
    assert (np.asarray(batch.indices[0]) < d).sum() == len(plain) + len(pairs)
    # The default namespace is crossed with the letter " ".
    batch, d = read_vw(["1 | a:2 |n b:3\n"], bits=18, quadratic=[" n"])
    expected = crossed_expected({"^a": 2, "n^b": 3}, [("^a", "n^b", 6)], 18)
    np.testing.assert_allclose(to_dense(batch, d)[0], expected)
    # The device's crosses (sketchopt.stream.crosses) are the same vectors.
    (chunk,) = data.iter_vw(lines, bits=22, quadratic=["ui", "uu"], crosses="device", chunk_size=4)
    np.testing.assert_allclose(crosses.dense_reference(chunk)[:2], np.stack([first, second]))


def test_read_vw_file_and_errors(tmp_path):
    path = tmp_path / "data.vw"
    path.write_text("1 |a x\n0 |a y:2\n")
    batch, d = read_vw(path, bits=16, loss="squared")
    np.testing.assert_array_equal(batch.labels, [1, 0])
    np.testing.assert_allclose(to_dense(batch, d), vw_expected([{"a^x": 1}, {"a^y": 2}], 16))
    batch, _ = read_vw(path, bits=16)
    np.testing.assert_array_equal(batch.labels, [1, -1])
    cases = [
        ("1 -2.0 |a x\n", r"line 1: the importance weight \(-2.0\) is negative"),
        ("1 |a x\n |a y\n", "line 2: no label"),
        ("1 |a x:z\n", r"line 1: the value of feature 'x' \('z'\) is not a number"),
        ("1 |a x:nan\n", r"line 1: the value of feature 'x' \('nan'\) is not finite"),
        ("1 1 0.5 |a x\n", "a base .* is not supported"),
        ("1 a x\n", "no '\\|'"),
    ]
    for text, match in cases:
        with pytest.raises(ValueError, match=match):
            read_vw(text.splitlines(True), bits=10, loss="squared")
    with pytest.raises(ValueError, match=r"found \[2.0\]"):
        read_vw(["2 |a x\n"], bits=10)
    with pytest.raises(ValueError, match="two namespace letters"):
        read_vw(["1 |a x\n"], bits=10, quadratic=["abc"])


def test_vw_feature_words_read_in_bulk_as_word_by_word():
    """A namespace whose words are all ``name:value`` has its values converted in one NumPy
    call; any other word sends the namespace through the word-by-word reading. Both read the
    same vectors, with Python's ``float`` semantics (underscores, signs, ``-0``, a name holding a
    colon); and the errors name the word either way."""
    bulk = "1 |n a:1.5 b:-2e-3 c:1_0 d:+3 e:-0 f:g:0.25\n"
    word_by_word = bulk.replace("\n", " z\n")  # one word without a value
    want = {"n^a": 1.5, "n^b": -2e-3, "n^c": 10.0, "n^d": 3.0, "n^e": -0.0, "n^f:g": 0.25}
    dense = []
    for line, features in ((bulk, want), (word_by_word, {**want, "n^z": 1.0})):
        batch, d = read_vw([line], bits=16)
        dense.append(to_dense(batch, d))
        np.testing.assert_allclose(dense[-1], vw_expected([features], 16), rtol=1e-7)
    np.testing.assert_array_equal(dense[1] - dense[0], vw_expected([{"n^z": 1.0}], 16))
    for word, match in (("x:inf", "not finite"), ("x:", "not a number"), (":1", "without a name")):
        with pytest.raises(ValueError, match=match):
            read_vw([f"1 |n a:1 {word}\n"], bits=16)


def test_name_hashes_remembered_and_forgotten(monkeypatch):
    """The feature-name hashes the crosses combine are remembered up to a bound, then forgotten
    at once: crossed vectors read with a memory of 3 names (cleared several times) equal those
    read with an ample one."""
    lines = ["1 |a x:1 y:2 |b u:3\n", "-1 |a y:1 z:2 |b v:1 w:2\n", "1 |a x:3 |b é:1\n"]
    dense = []
    for bound in (2**20, 3):
        remembered: dict = {}
        monkeypatch.setattr(data, "_HASHES", remembered)
        monkeypatch.setattr(data, "_HASHES_MAX", bound)
        batch, d = read_vw(lines, bits=16, quadratic=["ab"])
        dense.append(to_dense(batch, d))
        assert 0 < len(remembered) <= bound
    np.testing.assert_array_equal(dense[0], dense[1])
    assert np.count_nonzero(dense[0]) > 2 * len(lines)  # the crosses are there


# --------------------------------------------------------------------------------------------
# Crosses.


def brute_force_crosses(x, bits, seed):
    n, dim = x.shape
    out = np.zeros((n, 2**bits))
    for r in range(n):
        nonzero = np.flatnonzero(x[r])
        for a, i in enumerate(nonzero):
            for j in nonzero[a:]:
                column = hash_indices(np.array([i * dim + j]), bits, seed)[0]
                out[r, column] += x[r, i] * x[r, j]
    return out


def test_cross_features_against_brute_force():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(25, 30)) * (rng.random((25, 30)) < 0.3)
    x[4] = 0.0
    x[7] = rng.normal(size=30)  # a dense row: 465 pairs
    for bits, seed, max_pairs in ((6, 0, 1 << 22), (12, 5, 50), (12, 5, 1)):
        crosses = cross_features(scipy.sparse.csr_matrix(x), bits, seed=seed, max_pairs=max_pairs)
        assert crosses.shape == (25, 2**bits)
        np.testing.assert_allclose(crosses.toarray(), brute_force_crosses(x, bits, seed))
    # dense input, and one example through hash_pairs
    np.testing.assert_allclose(cross_features(x, 8).toarray(), brute_force_crosses(x, 8, 0))
    indices, values = hash_pairs(np.flatnonzero(x[7]), x[7][x[7] != 0], 8, dim=30)
    expected = brute_force_crosses(x[7:8], 8, 0)[0]
    np.testing.assert_array_equal(indices, np.flatnonzero(expected))
    np.testing.assert_allclose(values, expected[indices])
    assert cross_features(np.zeros((0, 5)), 4).shape == (0, 16)
    with pytest.raises(ValueError, match="dim"):
        cross_features(scipy.sparse.csr_matrix((1, 50000)), 10)


# --------------------------------------------------------------------------------------------
# VW's habits: the constant feature, unseen test features, VW text in chunks (issue 41).


def test_the_constant_is_one_more_feature_after_the_data(tmp_path):
    path = tmp_path / "a.svm"
    path.write_text("1 1:2 3:1\n0\n1 2:0.5\n")
    plain, d = load_svmlight(path)
    with_one, d1 = load_svmlight(path, constant=True)
    assert d1 == d + 1 == 4
    dense = to_dense(with_one, d1)
    np.testing.assert_array_equal(dense[:, :d], to_dense(plain, d))
    np.testing.assert_array_equal(dense[:, d], 1.0)  # the featureless example too
    (chunk,) = list(iter_svmlight(path, chunk_size=4, constant=True))
    assert not chunk.mask[3] and np.all(np.asarray(chunk.indices)[3] == d1)  # padding
    np.testing.assert_array_equal(to_dense(chunk, d1)[:3], dense)


def test_test_features_unseen_in_training_are_dropped_not_refused(tmp_path):
    path = tmp_path / "test.svm"
    path.write_text("1 1:1 7:2\n-1 2:3\n")
    with pytest.raises(ValueError, match="more than dim"):
        list(iter_svmlight(path, dim=3))
    (chunk,) = list(iter_svmlight(path, dim=3, unseen="drop", chunk_size=2, constant=True))
    np.testing.assert_array_equal(to_dense(chunk, 4), [[1, 0, 0, 1], [0, 3, 0, 1]])


def test_vw_text_in_chunks_equals_the_whole_read(tmp_path):
    lines = [
        "1 2.5 'first|a x:2 y |b z\n",
        "-1 |a y\n",
        "\n",
        "1 'tag |a x:-1 |b z:3 w\n",  # the tag touching nothing: a quoted word
        "-1 0.5 |b w:2\n",
        "1 |a x\n",
    ]
    path = tmp_path / "data.vw.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(lines)
    assert data.detect_format(path) == "vw"
    info = data.scan_vw(path, quadratic=["ab"])
    assert info.examples == 5 and info.weighted and info.labels == (-1.0, 1.0)
    assert info.nnz == 3 + 2  # x, y, z and their crosses x*z, y*z
    whole, d = read_vw(path, bits=12, quadratic=["ab"], constant=True)
    chunks = list(data.iter_vw(path, bits=12, quadratic=["ab"], constant=True, chunk_size=2))
    assert d == 2**12 + 1 and len(chunks) == 3
    got = np.concatenate([to_dense(c, d)[np.asarray(c.mask)] for c in chunks])
    np.testing.assert_allclose(got, to_dense(whole, d))
    np.testing.assert_allclose(got[:, -1], 1.0)
    weights = np.concatenate([np.asarray(c.weights)[np.asarray(c.mask)] for c in chunks])
    np.testing.assert_allclose(weights, [2.5, 1, 1, 0.5, 1])
    np.testing.assert_allclose(whole.weights, weights)
    np.testing.assert_array_equal(whole.labels, [1, -1, 1, -1, 1])


def test_detect_format_reads_the_first_example_line(tmp_path):
    svm, vw = tmp_path / "a.svm", tmp_path / "b.txt"
    svm.write_text("# a comment | with a bar\n\n1 3:1\n")
    vw.write_text("\n1 | a b\n")
    assert data.detect_format(svm) == "svmlight" and data.detect_format(vw) == "vw"


def test_scans_measure_the_normalized_norm(tmp_path):
    """``normalized_norm``: the mean over examples of ``sum_i (x_i / s_i)^2``, ``s_i`` the
    feature's largest ``|value|`` in the file (VW's normalized update's ``N``), the same in
    small blocks (merged across them) as whole, and by feature name in VW text."""
    rng = np.random.default_rng(0)
    x = scipy.sparse.random(60, 40, density=0.2, random_state=1, format="csr")
    x.data = rng.normal(size=x.data.shape) * rng.choice([1e-3, 1.0, 1e3], size=x.data.shape)
    path = tmp_path / "a.svm"
    dump_svmlight_file(x, rng.choice([-1.0, 1.0], 60), str(path))
    dense = x.toarray()
    s = np.abs(dense).max(axis=0)
    expected = np.sum((dense[:, s > 0] / s[s > 0]) ** 2) / 60
    for chunk_bytes in (64, 1 << 24):
        info = scan_svmlight(path, chunk_bytes=chunk_bytes)
        assert info.normalized_norm == pytest.approx(expected, rel=1e-12)
    binary = tmp_path / "b.svm"
    binary.write_text("1 1:1 3:1\n-1 2:1\n1 1:1 2:1 3:1\n")
    assert scan_svmlight(binary).normalized_norm == pytest.approx(2.0)  # the mean count
    vw = tmp_path / "c.vw"
    vw.write_text("1 |a x:2 y:1\n-1 |a x:-4 |b y:3\n")  # a^x max 4; a^y 1; b^y 3
    expected = ((2 / 4) ** 2 + 1 + 1 + 1) / 2
    assert data.scan_vw(vw).normalized_norm == pytest.approx(expected)
    # with -q crosses: times the features after the crosses over those before
    crossed = data.scan_vw(vw, quadratic=["ab"])
    assert crossed.normalized_norm == pytest.approx(expected * crossed.total / 4)
