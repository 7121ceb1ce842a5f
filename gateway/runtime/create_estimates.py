"""A reserving create's estimate, made while the file is stored.

With `budget_reservation: estimate` a create holds its batch's estimated cost, and the estimate is one streamed
pass over the file in a validation process: for a 200 MB file, seconds the create's caller waited, and in a
burst of small creates a process round trip each. So for a team that reserves, the pass starts as soon as one
of its `batch` files is stored (an upload, an Upload's `complete`), with every line counted (no endpoint, every
model): the most any create of that file can run, since a create's endpoint and its key's models only leave
lines out (and a line left out fails the batch at validation anyway). A create of the file takes that figure,
waiting for the pass if it still runs. A create that finds none (another replica stored the file, this process
started since, the pass failed, or the bound below let it go) makes its own, for its endpoint and models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.config.schema import Config
from gateway.config.urls import normalise_endpoint
from gateway.estimate.cost import Estimate, EstimateJob, estimate_file
from gateway.lru import LRU
from gateway.runtime.validation_processes import ValidationProcesses
from gateway.store.protocols import Blobs
from gateway.store.records import BatchRecord, FileRecord

log = logging.getLogger("batchyard.estimate")

# Files whose estimate is kept for their creates: a burst of uploads before their creates (20 teams x 50 files)
# fits; past it the oldest files' creates make their own. An entry is a few hundred bytes.
KEPT = 4096

Spawn = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]


class CreateEstimates:
    """`file_stored(file)`: start the estimate of a reserving team's batch file; `cost(batch, source)`: the USD a
    create of it holds."""

    def __init__(self, config: Config, blobs: Blobs, validation: ValidationProcesses | None,
                 reserves: Callable[[str], bool], spawn: Spawn) -> None:
        self._config, self._blobs, self._validation = config, blobs, validation
        self._reserves, self._spawn = reserves, spawn
        self._made: LRU[str, asyncio.Task[Estimate]] = LRU(KEPT)

    def file_stored(self, file: FileRecord) -> None:
        if file.purpose != "batch" or not self._reserves(file.owner):
            return
        task = self._spawn(self._estimate(EstimateJob(file.blob_key, None, None)), f"estimate-{file.id}")
        task.add_done_callback(_quiet)
        self._made.put(file.id, task)

    async def cost(self, batch: BatchRecord, source: FileRecord) -> float:
        """The high end of the file's cost estimate (the low end where a line has no output bound)."""
        made = self._made.get(source.id)
        if made is not None:
            try:
                return _held(await asyncio.shield(made))
            except Exception as exc:  # its own pass below says what is wrong, if anything still is
                log.info("the estimate made when file %s was stored failed (%s); made again", source.id, exc)
        endpoint = normalise_endpoint(batch.endpoint) if batch.endpoint != "*" else None
        return _held(await self._estimate(EstimateJob(source.blob_key, batch.options.allowed_models, endpoint)))

    async def _estimate(self, job: EstimateJob) -> Estimate:
        if self._validation is not None:
            return await self._validation.estimate(job)
        return await estimate_file(self._config, self._blobs, job)


def _held(estimate: Estimate) -> float:
    totals = estimate.totals()
    return float(totals["cost_high"] if totals["cost_high"] is not None else totals["cost_low"])


def _quiet(task: asyncio.Task[Estimate]) -> None:
    """A pass no create waited for may fail unseen (a create that comes makes its own): not an unretrieved error."""
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.exception()
