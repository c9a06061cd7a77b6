"""The documentation's examples run: the ```` ```{doctest} ```` blocks of ``docs/**/*.md`` (the
MyST form of ``sphinx.ext.doctest``) are checked with :mod:`doctest`, with the flags Sphinx uses
by default and, as Sphinx runs them, the blocks of one page in order in one namespace."""

from __future__ import annotations

import doctest
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
FLAGS = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.DONT_ACCEPT_TRUE_FOR_1
_BLOCK = re.compile(r"^```\{doctest\}[^\n]*\n(.*?)^```$", flags=re.S | re.M)
PAGES = [path for path in sorted(DOCS.rglob("*.md")) if _BLOCK.search(path.read_text())]


def test_docs_have_doctest_blocks():
    assert PAGES


@pytest.mark.slow
@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_docs_page_examples(path):
    text = path.read_text()
    namespace: dict = {}
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    parser = doctest.DocTestParser()
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1  # the block's first line, 0-based
        name = f"{path.relative_to(DOCS)}:{line + 1}"
        runner.run(parser.get_doctest(match.group(1), namespace, name, str(path), line))
    failed, attempted = runner.summarize(verbose=False)
    assert attempted and not failed, f"{failed} of {attempted} examples failed in {path.name}"
