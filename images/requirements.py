"""Print the requirements that pyproject.toml declares, one per line, for `pip install -r`.

The images install the dependencies in a layer of their own, from pyproject.toml alone, before
they copy the source: a change to the code then rebuilds only the last layer. The project's
own package list is left to `pip install .` (no directory is named here).

    python3 requirements.py pyproject.toml [--extra cpu] [--only torch | --skip torch]
"""

from __future__ import annotations

import argparse
import re
import tomllib


def _name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement, normalized (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"requirements.py: cannot read the name of {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject")
    parser.add_argument("--extra", action="append", default=[], help="also the requirements of this extra")
    parser.add_argument("--only", action="append", default=[], help="only these distributions")
    parser.add_argument("--skip", action="append", default=[], help="not these distributions")
    args = parser.parse_args()
    with open(args.pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    requirements = list(project.get("dependencies", []))
    for extra in args.extra:
        if extra not in project.get("optional-dependencies", {}):
            raise SystemExit(f"requirements.py: no extra {extra!r} in {args.pyproject}")
        requirements += project["optional-dependencies"][extra]
    only = {_name(n) for n in args.only}
    skip = {_name(n) for n in args.skip}
    for requirement in requirements:
        name = _name(requirement)
        if (only and name not in only) or name in skip:
            continue
        print(requirement)


if __name__ == "__main__":
    main()
