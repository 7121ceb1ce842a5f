"""The multiprocess directory: several processes on one machine, one scrape.

Set `PROMETHEUS_MULTIPROC_DIR` in the environment of every process before it
starts (prometheus-client reads it when it is first imported). Each process
then writes its values to files in that directory and a scrape sums them
(`MultiProcessCollector`). A process's live gauges are dropped when it exits
(`mark_process_dead`, at exit: `gateway.metrics.instruments` registers it;
`process_exited(pid)` for a parent whose child died hard), and
`prepare_multiprocess_dir()` at server start removes the files of processes
that are gone.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_DB_FILE = re.compile(r"_(\d+)\.db$")


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_multiprocess_dir() -> None:
    """At server start: remove the value files of processes that are gone.

    A live process's files stay: a `batchyard worker` sharing the directory may
    have started first, and it keeps writing to its files.
    """
    directory = multiprocess_dir()
    if not directory:
        return
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for file in path.glob("*.db"):
        match = _DB_FILE.search(file.name)
        if match is None or not _alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                file.unlink()


def reserve_value_files(pid: int) -> None:
    """Give this process's value files their disk blocks now. prometheus-client writes them through mmap
    into sparse files: a page first written while the disk is full kills the process with SIGBUS, in the
    very fault that the metrics must report. Reserved, they never need a block later (past their size, a
    file grows only when it fills: rare)."""
    directory = multiprocess_dir()
    if not directory:
        return
    for file in Path(directory).glob(f"*_{pid}.db"):
        with contextlib.suppress(OSError), open(file, "r+b") as f:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)


def process_exited(pid: int) -> None:
    """A process of the multiprocess directory exited: drop its live gauges (its counters stay)."""
    if multiprocess_dir():
        from prometheus_client import multiprocess

        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(pid)


__all__ = ["MULTIPROC_ENV", "multiprocess_dir", "prepare_multiprocess_dir", "process_exited", "reserve_value_files"]
