"""The documentation's examples run: every ```` ```{doctest} ```` block of ``docs/**/*.md`` (the
MyST form of ``sphinx.ext.doctest``) is checked with :mod:`doctest`, each block on its own with
the flags Sphinx uses by default, so a block must be complete and its printed output exact."""

from __future__ import annotations

import doctest
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
FLAGS = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.DONT_ACCEPT_TRUE_FOR_1
_BLOCK = re.compile(r"^```\{doctest\}[^\n]*\n(.*?)^```$", flags=re.S | re.M)


def _blocks():
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            yield pytest.param(path, line, match.group(1), id=f"{path.relative_to(DOCS)}:{line}")


BLOCKS = list(_blocks())


def test_docs_have_doctest_blocks():
    assert BLOCKS


@pytest.mark.slow
@pytest.mark.parametrize(("path", "line", "source"), BLOCKS)
def test_docs_doctest_block(path, line, source):
    name = f"{path.relative_to(DOCS)}:{line}"
    test = doctest.DocTestParser().get_doctest(source, {}, name, str(path), line - 1)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert attempted and not failed, f"{failed} of {attempted} examples failed in {name}"
