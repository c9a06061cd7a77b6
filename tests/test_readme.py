"""The README's example runs: every ```` ```python ```` block of ``README.md`` is executed, each in
a fresh namespace (the README promises a runnable example; its own assertion says it trains)."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_examples():
    assert BLOCKS, "the README has no ```python block"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index):
    code = compile(BLOCKS[index], f"README.md, python block {index}", "exec")
    exec(code, {"__name__": f"readme_block_{index}"})
