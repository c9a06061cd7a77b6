"""Print pip constraints pinning every declared dependency to its lowest allowed version.

``python .ci/lowest_requirements.py [EXTRA ...]`` reads ``pyproject.toml`` and turns each
``name>=X`` of ``[project] dependencies`` (and of the named optional extras) into ``name==X``,
one per line: the "lowest direct" resolution. ``make smoke-lowest`` installs the package under
these constraints into a separate environment and runs a smoke subset of the tests, so a lower
bound that is too low fails here instead of on a user's machine.
"""

from __future__ import annotations

import pathlib
import re
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)")


def lowest(requirements: list[str]) -> list[str]:
    pins = []
    for requirement in requirements:
        match = REQUIREMENT.match(requirement)
        if match is None:
            raise SystemExit(f"no lower bound to pin in {requirement!r}: declare one with '>='")
        name, _, version = match.groups()
        pins.append(f"{name}=={version}")
    return pins


def main() -> None:
    root = pathlib.Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in sys.argv[1:]:
        requirements += project["optional-dependencies"][extra]
    print("\n".join(lowest(requirements)))


if __name__ == "__main__":
    main()
