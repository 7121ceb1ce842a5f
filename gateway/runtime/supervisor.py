"""Worker processes of the embedded mode, started and watched by the process that owns the data dir.

`batchyard serve --workers N` (and `batchyard run` on a large upstream file)
start N `batchyard worker --data-dir D` processes over the same SQLite file and
blob directory. The first worker hosts every route; the others host only the
upstream ones, so a local vLLM engine is loaded once, in one process. A worker
that exits is started again (after a pause that grows while it keeps dying),
and the shards it held are handed back at once. Workers end when their parent
does: each watches its parent's pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway import metrics
from gateway.config.routes import RouteKind
from gateway.config.schema import Config
from gateway.store.faults import machine_fault, once_a_minute
from gateway.store.sqlite.queue import SQLiteQueue

log = logging.getLogger("batchyard.workers")

_RESTART_PAUSE_MAX = 10.0
# A worker's exit status for a config it cannot use (`gateway.cli.main`'s usage status): e.g. a setting only
# LiteLLM's Router refuses, met when the worker builds it. Starting it again would only fail again.
EXIT_CONFIG = 2
_SAID = "config error: "


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity, as a container or taskset limits it)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return len(getaffinity(0)) if getaffinity is not None else os.cpu_count() or 1


def default_workers(config: Config, *, serving: bool, cores: int | None = None, load: float | None = None) -> int:
    """Worker processes when `--workers` is not given: one per free core, for the upstream routes.

    Free cores: the usable ones, less one for this process (the API, or the run's own pipeline), less one
    per local model (its engine's loop keeps a core busy); for `run`, less those already busy (the 1-minute
    load average, rounded). `serve` always starts at least one and never reads the load: the API process
    never runs shards (its answers would wait behind them), and a server's process layout must not depend
    on a noisy number read once at start. With no upstream route there is nothing for extra workers to
    share: `run` starts none, `serve` one (local engines load in a worker, not in the API process).
    """
    cores = usable_cores() if cores is None else cores
    load = os.getloadavg()[0] if load is None else load
    models = {r.model_name: r.kind for r in config.routes.values()}
    local = sum(1 for kind in models.values() if kind is RouteKind.LOCAL)
    upstream = any(kind is not RouteKind.LOCAL for kind in models.values())
    if serving:
        return max(1, cores - 1 - local) if upstream else 1
    return max(0, cores - 1 - local - int(load + 0.5)) if upstream else 0


# How much nicer than the API process its workers run (POSIX niceness, 0..19): on a small machine a big
# batch's shards take the CPU the API's event loop needs; the scheduler now gives it to the API first.
WORKER_NICENESS = 5


@dataclass(slots=True)
class _Slot:
    index: int
    upstream_only: bool
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart: asyncio.TimerHandle | None = None


class Supervisor:
    def __init__(
        self, count: int, data_dir: Path, queue: SQLiteQueue, *, config_path: str, upstream_only: bool = False,
        verbose: bool = False, on_config_error: Callable[[str], None] | None = None,
    ) -> None:
        self.data_dir, self._queue = data_dir, queue
        self._on_config_error = on_config_error  # serve stops with it (exit 2) instead of restarting the worker
        self._config_path, self._verbose = config_path, verbose
        self._slots = [_Slot(i, upstream_only=upstream_only or i > 0) for i in range(count)]
        self._watcher: asyncio.Task[None] | None = None
        self.logs = data_dir / "logs"

    def _command(self, slot: _Slot) -> list[str]:
        # -P: the worker imports the installed package, never a `gateway/` folder in the current directory
        cmd = [sys.executable, "-P", "-m", "gateway.cli.main"]
        if self._verbose:
            cmd.append("-v")
        cmd += ["worker", "--config", self._config_path, "--data-dir", str(self.data_dir),
                "--parent-pid", str(os.getpid())]
        if slot.upstream_only:
            cmd.append("--upstream-only")
        return cmd

    def _start(self, slot: _Slot) -> None:
        slot.restart = None
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"worker-{slot.index}.log", "ab") as out:
            slot.process = subprocess.Popen(self._command(slot), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                            start_new_session=True)
        with contextlib.suppress(OSError):  # the OS prefers the API: its answers never wait behind a shard
            os.setpriority(os.PRIO_PROCESS, slot.process.pid, WORKER_NICENESS)
        slot.started_at = time.monotonic()

    async def start(self) -> None:
        for slot in self._slots:
            self._start(slot)
        self._watcher = asyncio.create_task(self._watch(), name="worker-pool")

    @property
    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process is not None and s.process.poll() is None]

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            for slot in self._slots:
                if slot.process is None or slot.process.poll() is None:
                    continue
                code, pid = slot.process.returncode, slot.process.pid
                slot.process = None
                # Its shards go back to the queue now, not after its heartbeat runs out (or, where the store
                # cannot take the release now, a full disk, then: the sweep's).
                try:
                    released = await self._queue.release(f"{socket.gethostname()}:{pid}")
                except Exception as exc:
                    fault = machine_fault(exc)
                    if fault is None:
                        raise
                    released = 0
                    if once_a_minute(fault.kind):
                        log.warning("%s unavailable (%s: %s); worker %d's shards go back at the next sweep",
                                    fault.service, fault.words, fault.detail, slot.index)
                metrics.process_exited(pid)
                if code == EXIT_CONFIG and self._on_config_error is not None:
                    said = self._config_error(slot)
                    log.error("worker %d (pid %d) cannot use the config: %s", slot.index, pid, said)
                    self._on_config_error(said)
                    return
                lived = time.monotonic() - slot.started_at
                slot.failures = 0 if lived > 60 else slot.failures + 1
                pause = min(_RESTART_PAUSE_MAX, 0.5 * 2 ** max(0, slot.failures - 1))
                log.warning("worker %d (pid %d) exited with %s after %.0f s; %d shard(s) handed back; "
                            "starting it again in %.1f s", slot.index, pid, code, lived, released, pause)
                slot.restart = asyncio.get_running_loop().call_later(pause, self._start, slot)
                slot.started_at = time.monotonic() + pause

    def _config_error(self, slot: _Slot) -> str:
        """What the worker said of the config (`config error: ...`, its log's last such line)."""
        path = self.logs / f"worker-{slot.index}.log"
        with contextlib.suppress(OSError), open(path, "rb") as log_file:
            log_file.seek(max(0, path.stat().st_size - 65536))
            lines = log_file.read().decode("utf-8", "replace").splitlines()
            said = [line.split(_SAID, 1)[1] for line in lines if _SAID in line]
            if said:
                return said[-1].strip()
        return f"worker {slot.index} exited with status {EXIT_CONFIG} (its log: {path})"

    async def aclose(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for slot in self._slots:
            if slot.restart is not None:
                slot.restart.cancel()
        running = [s.process for s in self._slots if s.process is not None and s.process.poll() is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in running:
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if process.poll() is None:
                process.kill()
                process.wait()


def watch_parent(parent_pid: int, stop: asyncio.Event) -> asyncio.Task[None]:
    """Set `stop` when the parent process is gone (killed or exited without stopping us)."""

    async def watch() -> None:
        while os.getppid() == parent_pid:
            await asyncio.sleep(0.5)
        stop.set()

    return asyncio.create_task(watch(), name="watch-parent")


__all__ = ["Supervisor", "watch_parent"]
