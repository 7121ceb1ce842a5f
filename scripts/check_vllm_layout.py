"""Check `local_engine/vllm_compat.py`'s table against a vLLM release without installing it.

    python scripts/check_vllm_layout.py vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl [more wheels or dirs]
    python scripts/check_vllm_layout.py /path/to/site-packages      # an installed vllm/

A release of another torch (0.26 pins torch 2.11, 0.33 torch 2.14) cannot be imported beside this
project's torch, but its wheel can be read: for every moved name, this finds the module the runtime
lookup (`vllm_compat.load`) would pick, the first home whose file exists and defines or imports the
name, by reading the source (ast), and checks that every unchanged name is where the table says.
Exit status 1 if a required name is missing from a release. It downloads nothing: get wheels with
`pip download --no-deps --only-binary=:all: vllm==0.26.0` (the GPU recipe's prepare.sh keeps one).
"""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_engine.vllm_compat import HOMES, OPTIONAL_HOMES, PREFIX, UNCHANGED


class Release:
    """The .py files of one vLLM release: a wheel, or a folder holding vllm/."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self._zip = zipfile.ZipFile(where) if where.is_file() else None
        self._names = set(self._zip.namelist()) if self._zip else None
        self.version = self._version()

    def source(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            if self._zip is not None and self._names is not None:
                if rel in self._names:
                    return self._zip.read(rel).decode()
            elif (self.where / rel).is_file():
                return (self.where / rel).read_text()
        return None

    def _version(self) -> str:
        text = self.source("vllm._version") or ""
        for line in text.splitlines():
            if line.startswith(("__version__", "version")) and "=" in line:
                return line.rsplit("=", 1)[1].strip().strip("'\"")
        return self.where.name


def defines(source: str, name: str) -> bool:
    """`name` is bound at the module's top level: def, class, assignment or import."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.ImportFrom | ast.Import) and any(
                (a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
    return False


def home_of(release: Release, name: str, homes: tuple[str, ...]) -> str | None:
    for home in homes:
        source = release.source(PREFIX + home)
        if source is not None and defines(source, name):
            return home
    return None


def check(release: Release) -> list[str]:
    problems = []
    print(f"== vllm {release.version} ({release.where.name})")
    for name, homes in HOMES.items():
        found = home_of(release, name, homes)
        print(f"   {name:34} {found or 'MISSING'}")
        if found is None:
            problems.append(f"{release.version}: {name} in none of {homes}")
    for name, homes in OPTIONAL_HOMES.items():
        print(f"   {name:34} {home_of(release, name, homes) or 'absent (optional)'}")
    for module, names in UNCHANGED.items():
        source = release.source(module)
        for name in names:
            if source is None or not defines(source, name):
                problems.append(f"{release.version}: {module}.{name} missing")
    print(f"   unchanged names: {'ok' if not any('missing' in p for p in problems) else 'SEE BELOW'}")
    return problems


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    problems = [p for arg in sys.argv[1:] for p in check(Release(Path(arg)))]
    for p in problems:
        print(f"PROBLEM {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
