"""The documentation's pages read on GitHub as they do on the site (``make docs``).

Most users read ``docs/`` where the repository is hosted, which renders CommonMark, not MyST: a
role such as ``{func}`sketchopt.ada_fd``` shows there as raw text. So the pages name objects as
plain code spans (`` `sketchopt.ada_fd` ``, which ``docs/_ext/sketchopt_docs.py`` links on the
site) and other pages by relative Markdown links. Checked here, fast (no Sphinx):

* no MyST role outside code (code blocks and code spans are skipped, so a ``_{live}`` in a
  formula's code span is not one; a directive's Markdown content is checked);
* every relative link and image of a page points to a file of the repository;
* no page points to a ``DESIGN.md``: the design record is ``docs/design.md``.

Fenced directives (```` ```{doctest} ````, ``{toctree}``, ``{results-table}``) are allowed: they
are blocks, which GitHub shows as code, and the site needs them. The one exception is
``docs/api/``, the API reference, which exists only as Sphinx builds it (autosummary's directives
and the generated pages): GitHub cannot show it whatever its markup.
"""

import json
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _pages() -> list[pathlib.Path]:
    pages = [p for p in DOCS.rglob("*.md") if DOCS / "api" not in p.parents]
    pages += sorted(DOCS.glob("notebooks/*.ipynb"))
    pages += [REPO / "README.md", REPO / "CHANGELOG.md"]
    return sorted(pages)


#: Fenced blocks whose content is code, not Markdown: a plain or language fence, or one of these
#: directives. Other directives' content (a note, a toctree) is Markdown and checked.
CODE_DIRECTIVES = ("doctest", "testcode", "testoutput", "code-block", "code", "code-cell")


def _prose(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line number, line)`` of a page's Markdown outside code blocks (a notebook's Markdown
    cells, numbered within the notebook's Markdown)."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    out, fence, directives = [], None, []  # the open code fence; the open Markdown directives

    def closes(line: str, opened: str) -> bool:
        line = line.strip()
        return line.startswith(opened) and not line.strip(opened[0])

    for number, line in enumerate(text.splitlines(), 1):
        opening = re.match(r"\s*(`{3,}|~{3,})\s*(\S*)", line)
        if fence is not None:
            fence = None if closes(line, fence) else fence
        elif directives and closes(line, directives[-1]):
            directives.pop()
        elif opening:
            directive = re.fullmatch(r"\{([\w-]+)\}.*", opening.group(2))
            if directive is None or directive.group(1) in CODE_DIRECTIVES:
                fence = opening.group(1)
            else:  # a directive whose content is Markdown
                directives.append(opening.group(1))
                out.append((number, line))
        else:
            out.append((number, line))
    return out


ROLE = re.compile(r"\{[A-Za-z][\w:.+-]*\}`")


def roles(line: str) -> list[str]:
    """The MyST roles of one line of prose: a ``{name}`` directly before a backtick, outside
    code spans (a run of backticks opens one, closed by a run of the same length)."""
    found, i = [], 0
    while i < len(line):
        role = ROLE.match(line, i)
        if role:
            found.append(role.group(0))
            i = role.end() - 1  # the backtick opens the role's content, a code span
        run = re.match(r"`+", line[i:])
        if run:
            close = line.find(run.group(0), i + len(run.group(0)))
            i = len(line) if close < 0 else close + len(run.group(0))
        else:
            i += 1
    return found


def test_the_role_finder_skips_code_spans():
    assert roles("see {func}`sketchopt.ada_fd` and {mod}`sketchopt.son`.") == [
        "{func}`",
        "{mod}`",
    ]
    assert roles("a compaction `Z <- [F Z]_{live}`, `F <- I`") == []
    assert roles("``{func}`x` `` is how a role is written") == []
    assert roles("plain `sketchopt.ada_fd`") == []


def test_code_blocks_are_skipped_and_directives_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```{note}\nsee {func}`a`\n```\nprose {func}`b`\n```python\nx = '{c}`'\n```\n"
        "````\n```\n{func}`d`\n```\n````\n```{doctest}\n>>> '{e}`'\n```\nafter {mod}`f`\n"
    )
    found = [(number, roles(line)) for number, line in _prose(page) if roles(line)]
    assert found == [(2, ["{func}`"]), (4, ["{func}`"]), (16, ["{mod}`"])]


PAGES = _pages()


@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_a_page_has_no_role_and_no_broken_relative_link(path):
    problems = []
    for number, line in _prose(path):
        problems += [f"line {number}: MyST role {r}...`" for r in roles(line)]
        if re.search(r"(?<![\w])DESIGN\.md", line):
            problems.append(f"line {number}: DESIGN.md (the design page is docs/design.md)")
        code_free = re.sub(r"(`+).*?\1", "", line)
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", code_free):
            if re.match(r"[a-z]+:|#", target):
                continue  # a URL or an anchor of the page itself
            if not (path.parent / target.split("#")[0]).exists():
                problems.append(f"line {number}: link to {target}, which does not exist")
    assert not problems, "\n".join(problems)
