"""Validation in processes of their own: one team's upload never stalls another team's API calls.

Checking a file's lines is CPU work in Python (JSON, the per-line rules, the shard lines' bytes): 500,000
lines take about 5 s. On the API's event loop every other request waited for it; in a thread it still
holds the GIL against the loop (p99 161 ms under load). So the API's runtime hands each batch to a small
pool of processes, which read the input file from the blobs and write the shard blobs themselves,
streamed, and send back only the `PlanOutcome` (the shards' names and sizes, the first errors, counts).
The API process records it: nothing is recorded by a child, so a child that dies leaves no half-made record.
The same processes do the other CPU work a door would otherwise do on the API's loop: a file's cost
estimate, and the reading of a Message Batch create's body (`read_create`: from the spooled body's file to
the input lines' file, by path).

The processes run at a lower CPU priority (`CHILD_NICENESS`): on a small machine the API's loop wins the
cores whenever both want one, so another team's calls stay prompt while a large file is read; the work
itself is background (a batch waits for validation anyway) or a create whose own caller waits for it.

A child that dies mid-plan (killed, out of memory) fails the plans it held with `BrokenProcessPool`: their
batches stay `validating`, their validate leases are released, and the sweeper validates them
again (the one recovery path); the next plan starts fresh processes. A Message Batch create's read or an
estimate that meets `BrokenProcessPool` is tried once more, in the fresh processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TypeVar

from gateway import tracing
from gateway.config.schema import Config
from gateway.estimate.cost import Estimate, EstimateJob, estimate_file
from gateway.message_batches.envelope import read_create
from gateway.message_batches.wire import EnvelopeError
from gateway.pipeline.plan import PlanJob, PlanOutcome, plan_batch
from gateway.runtime.job_order import JobOrder
from gateway.runtime.loop import loop_factory
from gateway.store.blobs.place import BlobPlace
from gateway.store.faults import CarriedFault, machine_fault
from gateway.store.protocols import Blobs

log = logging.getLogger("batchyard.validation")

T = TypeVar("T")

# Two, so that a small batch is not kept waiting behind one large file; more would take cores from the
# workers that run the shards (a validation keeps one core busy while it lasts).
VALIDATION_PROCESSES = 2
# Added to each child's niceness. At +5 a child gets about a quarter of a core that the API process also
# wants (Linux's CFS weights), and all of an idle one: the API's loop wins a contended core at once, while a
# validation still moves beside busy workers (a CPU engine's); its wall is the same on a machine not
# otherwise busy.
CHILD_NICENESS = 5


class ValidationProcesses:
    """`plan(job)`: the batch planned in one of `size` processes over the same config and blobs."""

    def __init__(self, config: Config, place: BlobPlace, size: int = VALIDATION_PROCESSES) -> None:
        self._config, self._place, self._size = config, place, size
        self._executor: ProcessPoolExecutor | None = None
        self._order = JobOrder(size)

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # spawn, not fork: the API process runs threads (the event loop's executor, the store's clients)
            self._executor = ProcessPoolExecutor(
                self._size, mp_context=multiprocessing.get_context("spawn"), initializer=_start_child,
                initargs=(self._config, self._place, logging.getLogger().level, os.getpid()),
            )
        return self._executor

    def start(self) -> None:
        """Start one process now, so that the first batch does not wait for an interpreter to start
        (the pool starts the others as plans overlap)."""
        self._pool().submit(_ready)

    async def plan(self, job: PlanJob) -> PlanOutcome:
        try:
            return await self._run(lambda executor: executor.submit(_plan_in_child, job), urgent=False)
        except BrokenProcessPool:
            log.warning("a validation process died while planning batch %s; the sweep validates it again",
                        job.batch_id)
            raise

    async def estimate(self, job: EstimateJob) -> Estimate:
        """A file's cost estimate (`GET /v1/files/{id}/cost_estimate`), in one of the processes: the same CPU
        work as a validation, kept off the API's event loop the same way (each process loads a tokenizer once)."""
        return await self._run(lambda executor: executor.submit(_estimate_in_child, job), urgent=True)

    async def read_create(self, source: Path, sink: Path) -> int:
        """`gateway.message_batches.envelope.read_create` in one of the processes, from the spooled create body
        at `source` to the input lines at `sink` (written from its start); its `EnvelopeError`s come back as
        raised there. In the API process the GIL is free for the loop meanwhile (in a thread, the parse held
        it: another team's p99 past 100 ms during a 200 MB create)."""
        return await self._run(lambda executor: executor.submit(_read_create_in_child, str(source), str(sink)),
                               urgent=True)

    async def _run(self, submit: Callable[[ProcessPoolExecutor], Future[T]], *, urgent: bool) -> T:
        """A job's answer from the pool, `urgent` when its caller waits for it (`JobOrder`: before the plans); a
        pool a child died in is dropped (the next job starts fresh ones)."""
        async with self._order.slot(urgent):
            executor = self._pool()
            try:
                return await asyncio.wrap_future(submit(executor))
            except BrokenProcessPool:
                if self._executor is executor:
                    self._executor = None
                    executor.shutdown(wait=False, cancel_futures=True)
                raise

    async def aclose(self) -> None:
        """Stop the processes at once: a plan cut short leaves its batch `validating`, for the sweep."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        # ProcessPoolExecutor has no public way to stop a running job before Python 3.14's terminate_workers().
        children = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for child in children:
            with contextlib.suppress(Exception):
                child.terminate()
        for child in children:
            await asyncio.to_thread(child.join, 5)


# -- in the child ------------------------------------------------------------------------------------------

_child: tuple[Config, Blobs, asyncio.AbstractEventLoop] | None = None


def _start_child(config: Config, place: BlobPlace, log_level: int, parent_pid: int) -> None:
    global _child
    with contextlib.suppress(OSError):  # the API's loop first, when both want a core
        os.nice(CHILD_NICENESS)
    # Ctrl-C reaches the whole process group: the API process decides when its children stop (`aclose`).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="watch-parent", daemon=True).start()
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tracing.start_process("validation", config.batch.tracing)
    # One loop for the child's life: the blobs' clients (S3's connection pool) are opened once, on it.
    # The loop every process runs on (uvloop where installed; aiohttp's cut-off write task logged as one line).
    _child = (config, place.open(), loop_factory()())


def _watch_parent(parent_pid: int) -> None:
    """End with the API process, even mid-plan, when it was killed: the pool's queue never closes then
    (a child holds both of its ends), and the batch is validated again after the restart."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def _ready() -> None:
    return None


class PlanFailed(RuntimeError):
    """A plan that raised in the child, as plain text: whatever was raised there (an exception that does not
    pickle, one too deep to) comes back as this, and the service fails the batch with it."""


def _plan_in_child(job: PlanJob) -> PlanOutcome:
    assert _child is not None, "the pool's initializer sets up the child"
    config, blobs, loop = _child
    try:
        with tracing.remote_span("batch.plan", job.trace_context):  # in the batch's trace, from the API process
            return loop.run_until_complete(plan_batch(config, blobs, job))
    except Exception as exc:
        fault = machine_fault(exc)
        if fault is not None:  # the machine's, not the file's: the batch waits for the sweep, no traceback
            raise CarriedFault(fault.kind, fault.detail) from None
        log.exception("planning batch %s failed", job.batch_id)  # the traceback stays in this process's log
        raise PlanFailed(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        tracing.flush()  # a pool's child ends by os._exit: no exit hook would send its spans


def _estimate_in_child(job: EstimateJob) -> Estimate:
    assert _child is not None, "the pool's initializer sets up the child"
    config, blobs, loop = _child
    try:
        return loop.run_until_complete(estimate_file(config, blobs, job))
    except Exception as exc:
        log.exception("estimating %s failed", job.input_key)
        raise PlanFailed(f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _read_create_in_child(source: str, sink: str) -> int:
    try:
        with open(source, "rb") as body, open(sink, "wb") as lines:
            return read_create(body, lines)
    except EnvelopeError:
        raise  # the body's refusal: plain words that pickle, answered by the door as Anthropic's 400
    except Exception as exc:
        fault = machine_fault(exc)
        if fault is not None:  # a full disk: the door's storage error, no traceback
            raise CarriedFault(fault.kind, fault.detail) from None
        log.exception("reading a Message Batch create failed")
        raise PlanFailed(f"{type(exc).__name__}: {str(exc)[:200]}") from None


__all__ = ["CHILD_NICENESS", "VALIDATION_PROCESSES", "PlanFailed", "ValidationProcesses"]
