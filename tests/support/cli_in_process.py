"""`batchyard ARGS` called as a function (`gateway.cli.main.main(argv)`), where a test needs only what a
subprocess would give it: the exit status, stdout and stderr.

A `batchyard` subprocess spends seconds importing LiteLLM before it does anything; called as a function,
a pytest worker pays that once. `main(argv)` is built for it: with `argv` given it leaves the process's
descriptors and logging handlers alone. What it does change for the rest of the process is put back
after each call: the environment (a config's `environment_variables` section sets variables, as LiteLLM's
proxy does), the working directory, the library loggers `quiet_libraries` silences, and LiteLLM's module
settings (`providers.litellm_setup.apply` sets a config's `litellm_settings` on the module, as the proxy does).

Tests of what only a process has (its exit by signal, SIGKILL and restart, descriptors, the drop-in
command line) keep running `batchyard` as a subprocess; each CLI command keeps at least one such test.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gateway.cli.main import main
from tests.support import environ

# The loggers `gateway.cli.main.quiet_libraries` quiets (handlers cleared, not propagated).
QUIETED = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx")


def _settings(module: ModuleType) -> dict[str, tuple[Any, list[Any] | None]]:
    """A module's attributes (not its submodules): each value, and a list's items (callbacks are appended)."""
    return {key: (value, list(value) if isinstance(value, list) else None) for key, value in vars(module).items()
            if not key.startswith("__") and not isinstance(value, ModuleType)}


def _restore(module: ModuleType, saved: dict[str, tuple[Any, list[Any] | None]]) -> None:
    for key, (value, items) in saved.items():
        if getattr(module, key, None) is not value:
            setattr(module, key, value)
        if items is not None and (len(value) != len(items)
                                  or any(a is not b for a, b in zip(value, items, strict=True))):
            value[:] = items


def batchyard(capsys: pytest.CaptureFixture[str], *args: str, env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`batchyard ARGS` with `env` added to the environment, in `cwd`: as `subprocess.run(..., text=True)`
    returns it (a usage error's SystemExit is its exit status, as for the process)."""
    import litellm  # every command called here loads it (prices, the Router): its settings are saved first

    saved_env, saved_cwd, saved_litellm = dict(os.environ), os.getcwd(), _settings(litellm)
    # the Router registers its deployments' model_info in LiteLLM's price map: a later command in this
    # process would then find prices (and an exact tokenizer) its own process would not
    saved_prices = dict(litellm.model_cost)
    loggers = [(lg, lg.level, list(lg.handlers), lg.propagate) for lg in map(logging.getLogger, QUIETED)]
    os.environ.update(env or {})
    if cwd is not None:
        os.chdir(cwd)
    capsys.readouterr()  # what the test printed before is not the command's
    try:
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage error: exit status 2
            code = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
    finally:
        environ.restore(saved_env)
        os.chdir(saved_cwd)
        _restore(litellm, saved_litellm)
        litellm.model_cost.clear()
        litellm.model_cost.update(saved_prices)
        for lg, level, handlers, propagate in loggers:
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate = propagate
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)
