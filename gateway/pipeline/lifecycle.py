"""A batch's lifecycle rules, in one place every stage may import (why its requests must stop is
`gateway.lines.stops`, below the backends, which ask it too).

- When a file or batch expires (`expiry`, from OpenAI's `expires_after` objects).
- The ids derived from a batch id (`derived_id`), so work done twice lands once, and which batch a
  result file is of (`results_batch`: its results order index goes with it).
- `Announce`: the hook told a batch is about to end, before its final status is
  set (webhooks record their event there: at least once, even across a crash).

It depends on the records and the store's record types only: the runner, the
finalizer and the sweeper all ask it, so it must sit below all of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.domain import BatchStatus, Shard
from gateway.pipeline.batch_params import ExpiresAfter, checked
from gateway.store.records import BatchRecord, FileRecord

# (owner, batch id, the final status about to be set): called before the status is written, so an
# event recorded there survives a crash between the two (the finalizer runs again and records it again).
Announce = Callable[[str, str, BatchStatus], Awaitable[None]]


async def announce_nothing(owner: str, batch_id: str, status: BatchStatus) -> None:
    """The `Announce` of a runtime without webhooks."""


NO_EXPIRY = 10 * 365 * 86_400  # the CLI's batches don't expire


def for_queue(shard: Shard, batch: BatchRecord) -> Shard:
    """The shard as the queue carries it: whose it is and its batch's deadline, for the fair pick."""
    return dataclasses.replace(shard, team=batch.owner, deadline=batch.expires_at)


def derived_id(prefix: str, batch_id: str, what: str) -> str:
    # Output file ids follow from the batch id (128 random bits), so finalizing
    # twice (a retry after a crash) writes the same files instead of new ones.
    return f"{prefix}-{hashlib.sha256(f'{batch_id}:{what}'.encode()).hexdigest()[:32]}"


def results_batch(rec: FileRecord) -> str | None:
    """The batch whose output or error file `rec` is (the finalizer names it `{batch_id}_{what}.jsonl`, and
    its id follows from the batch's); None for any other file."""
    if rec.purpose != "batch_output":
        return None
    batch_id, _, what = rec.filename.removesuffix(".jsonl").rpartition("_")
    return batch_id if what in ("output", "error") and rec.id == derived_id(
        "file", batch_id, "output" if what == "output" else "errors") else None


def expiry(expires_after: ExpiresAfter | Mapping[str, Any] | None, created_at: int, param: str) -> int | None:
    """The expiry time an `expires_after` object ({anchor: created_at, seconds}) gives; checked by its model."""
    if not expires_after:
        return None
    return checked(ExpiresAfter, expires_after, param).at(created_at)


__all__ = ["NO_EXPIRY", "Announce", "announce_nothing", "derived_id", "expiry", "for_queue",
           "results_batch"]
