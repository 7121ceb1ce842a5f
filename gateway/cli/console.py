"""What `batchyard run` shows on the terminal, and where everything else goes.

A clean run shows the progress bar and the summary, nothing else. vLLM, torch,
transformers and LiteLLM write warnings from Python (logging, `warnings`), from
C++ (straight to file descriptors 1 and 2) and from the engine-core child
process (which inherits those descriptors). So quiet mode points descriptors 1
and 2 at a log file, and keeps private duplicates of the real stdout and
stderr for our own output: `terminal()` (progress, summary, errors, our
warnings) and `stdout_bytes()` (the results with `-o -`). With `-v` nothing is
redirected and everything is logged to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, TextIO

from gateway.log_safe import EscapeArgs, escape_every_handler

_OUR_LOGGERS = ("gateway", "local_engine", "providers")

_terminal: TextIO | None = None
_stdout: BinaryIO | None = None
_log_path: Path | None = None


def terminal() -> TextIO:
    """The user's stderr (a private copy of it in quiet mode)."""
    return _terminal if _terminal is not None else sys.stderr


def stdout_bytes() -> BinaryIO:
    """The user's stdout, for `-o -`."""
    return _stdout if _stdout is not None else sys.stdout.buffer


def log_path() -> Path | None:
    """The log file of this run, when quiet mode is on and something was written to it."""
    if _log_path is None:
        return None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        return _log_path if _log_path.stat().st_size > 0 else None
    except OSError:
        return None


def say(message: str) -> None:
    print(f"batchyard: {message}", file=terminal(), flush=True)


class _Ours(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"batchyard: {record.levelname.lower()}: {record.getMessage()}"


def setup(*, verbose: bool, log_file: str | None = None, own_process: bool = True) -> Path | None:
    """Route output for one `batchyard run`; returns the log file (None with `verbose`).

    `own_process=False` (the command called as a function, e.g. from tests) leaves the process's
    descriptors and logging handlers alone and only sets the levels.
    """
    global _terminal, _stdout, _log_path
    # vLLM then adds no handler of its own (it would print to stdout); its records reach the root logger.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    if verbose or not own_process:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
        escape_every_handler()
        return None
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    logging.captureWarnings(True)
    path = Path(log_file) if log_file else Path(tempfile.gettempdir()) / (
        f"batchyard-run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    _terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    _stdout = os.fdopen(os.dup(1), "wb")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    _log_path = path
    # Everything (ours included) is logged to the file at INFO; our own warnings also reach the terminal.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    ours = logging.StreamHandler(_terminal)
    ours.setLevel(logging.WARNING)
    ours.setFormatter(_Ours())
    ours.addFilter(EscapeArgs())
    for name in _OUR_LOGGERS:
        logging.getLogger(name).addHandler(ours)
    escape_every_handler()
    return path


__all__ = ["log_path", "say", "setup", "stdout_bytes", "terminal"]
