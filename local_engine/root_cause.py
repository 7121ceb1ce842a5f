"""Why an engine-core process failed to start, told to the process that started it.

When vLLM's engine core fails in its own process, the starting process gets only "Engine core
initialization failed. See root cause above." — the cause was logged by the child, on its stderr (a
worker's log file under `serve`). The operator reads the route's reason in the API, the dashboard and
`/health`, so the cause must travel. On a CPU vLLM spawns that process, so nothing set in ours reaches it
but its `vllm_config`: its logging config (`logging_config.pylogging_config_file`) is pointed, for the
start, at vLLM's own default `dictConfig` plus one handler (`CauseFile`) that writes the exception logged
with `EngineCore failed to start.` (logger `vllm.v1.engine.core`), as one line, to a file the parent
reads when the start fails. With vLLM's logging off (`VLLM_CONFIGURE_LOGGING=0`, which `batchyard run` sets so
that vLLM's records reach our root logger) the child gets a config holding only that handler, its loggers
left as logging off leaves them (records propagate to the root logger). An operator's own logging config (a
file, the JSON formatter) is left alone: the message then stays vLLM's. In process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) the exception itself is the cause.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENGINE_CORE_LOGGER = "vllm.v1.engine.core"
MAX_CAUSE_CHARS = 2000  # a reason is shown on a page and in every line's error: bounded


class CauseFile(logging.Handler):
    """Writes the last exception `vllm.v1.engine.core` logs to `path` (built by `dictConfig` in the child)."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.ERROR)
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != ENGINE_CORE_LOGGER or not record.exc_info or record.exc_info[1] is None:
            return
        exc = record.exc_info[1]
        text = " ".join("".join(traceback.format_exception_only(type(exc), exc)).split())
        # "r+": never made anew, so a running engine's later errors, once the file is gone, go nowhere
        with contextlib.suppress(OSError), open(self.path, "r+", encoding="utf-8") as out:
            out.write(text[:MAX_CAUSE_CHARS])
            out.truncate()


class Cause:
    """What the engine-core process logged as the exception it failed on (None: nothing)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path

    def read(self) -> str | None:
        if self._path is None:
            return None
        with contextlib.suppress(OSError):
            return self._path.read_text(encoding="utf-8").strip() or None
        return None


def _temp(prefix: str, text: str = "") -> Path:
    fd, name = tempfile.mkstemp(prefix=prefix)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return Path(name)


def _logging_with_cause(logging_config: Any, cause_path: Path) -> dict[str, Any]:
    """vLLM's default logging `dictConfig` at the config's level (as `vllm.logger` builds it, text format),
    plus the `CauseFile` handler on the `vllm` logger."""
    from vllm import envs
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    level = logging_config.log_level
    config["handlers"]["vllm"].update(level=level, stream=envs.VLLM_LOGGING_STREAM, formatter="vllm")
    for formatter in config["formatters"].values():
        formatter["log_level"] = level
    config["loggers"]["vllm"]["level"] = level
    config["handlers"]["batchyard_cause"] = _handler(cause_path)
    config["loggers"]["vllm"]["handlers"].append("batchyard_cause")
    return config


def _handler(cause_path: Path) -> dict[str, str]:
    return {"()": f"{__name__}.CauseFile", "path": str(cause_path)}


def _only_cause(cause_path: Path) -> dict[str, Any]:
    """Logging off, plus the `CauseFile` handler on the engine core's logger: nothing else is configured, and
    its records still propagate to the root logger as they do with vLLM's logging off."""
    return {"version": 1, "disable_existing_loggers": False,
            "handlers": {"batchyard_cause": _handler(cause_path)},
            "loggers": {ENGINE_CORE_LOGGER: {"handlers": ["batchyard_cause"], "propagate": True}}}


@contextlib.contextmanager
def captured(vllm_config: Any) -> Iterator[Cause]:
    """While the engine starts: the exception its engine-core process fails on, readable from the `Cause`."""
    logging_config = getattr(vllm_config, "logging_config", None)
    if logging_config is None or logging_config.pylogging_config_file \
            or (logging_config.configure_logging and logging_config.formatter != "text"):
        yield Cause(None)
        return
    logging_on = logging_config.configure_logging
    cause_path = _temp("batchyard-engine-cause-")
    config = _logging_with_cause(logging_config, cause_path) if logging_on else _only_cause(cause_path)
    config_path = _temp("batchyard-engine-logging-", json.dumps(config))
    # vLLM reads a config file only with its logging on; the file above keeps "off" as it was
    logging_config.configure_logging = True
    logging_config.pylogging_config_file = str(config_path)
    try:
        yield Cause(cause_path)
    finally:
        logging_config.configure_logging = logging_on
        logging_config.pylogging_config_file = None
        for path in (cause_path, config_path):
            with contextlib.suppress(OSError):
                path.unlink()


def explained(exc: BaseException, cause: Cause) -> BaseException:
    """`exc`, or, when it only points at a cause logged elsewhere ("See root cause above"), a RuntimeError
    saying that cause (raise it from `exc`)."""
    said = cause.read()
    if said is None or "root cause above" not in str(exc):
        return exc
    return RuntimeError(said)


__all__ = ["Cause", "CauseFile", "captured", "explained"]
