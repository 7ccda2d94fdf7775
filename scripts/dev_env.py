"""What ``./dev.sh`` installs: the requirements of ``pyproject.toml`` this Python does not
meet, one per line (nothing when all are met).

    python scripts/dev_env.py [GROUP ...]

Groups: the package's own dependencies always; an extra of ``pyproject.toml`` by its name
(``test``, ``docs``, ...); ``build`` for the build system's (a wheel built without isolation);
``cpu-interpreter`` for what Triton's CPU interpreter needs (how a machine without CUDA runs
the Triton kernels). torch is never listed: ``./dev.sh`` installs a CPU build itself where
none is installed, so that no requirement pulls the default wheel and its CUDA libraries.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib
try:
    from packaging.requirements import Requirement
except ModuleNotFoundError:  # pip vendors packaging where it is not installed on its own
    from pip._vendor.packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: Triton's interpreter on the CPU (``TRITON_INTERPRET=1``) needs these versions.
CPU_INTERPRETER = ["triton>=3.8", "numpy>=2.4"]


def requirements(groups: Iterable[str], pyproject: Path = PYPROJECT) -> list[str]:
    """The requirement strings of ``groups`` (see the module), the package's own first."""
    data = tomllib.loads(pyproject.read_text())
    extras = data["project"].get("optional-dependencies", {})
    out = list(data["project"]["dependencies"])
    for group in groups:
        if group == "build":
            out += data["build-system"]["requires"]
        elif group == "cpu-interpreter":
            out += CPU_INTERPRETER
        elif group in extras:
            out += extras[group]
        else:
            raise SystemExit(f"dev_env.py: unknown group {group!r} (extras: "
                             f"{', '.join(sorted(extras))}; build; cpu-interpreter)")
    return out


def unmet(required: Iterable[str]) -> Iterator[str]:
    """Those of ``required`` whose distribution is missing or of a version outside the
    specifier (torch excepted, see the module)."""
    for text in required:
        req = Requirement(text)
        if req.name == "torch":
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            yield text
            continue
        if not req.specifier.contains(version, prereleases=True):
            yield text


def main(argv: list[str]) -> int:
    for text in unmet(requirements(argv)):
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
