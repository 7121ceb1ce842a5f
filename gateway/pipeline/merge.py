"""Sealing shards and merging them into the output files, in input order.

`seal_shard` turns one shard's journal into a results blob sorted by line
(memory: one shard), and deletes the shard's requests blob. `merge_shards` k-way merges the sealed shards by line
number into the output file and, optionally, a separate error file (memory:
one line per shard).
"""

from __future__ import annotations

import contextlib
import heapq
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway import metrics
from gateway.domain import BatchRequest, Result, Shard, Usage
from gateway.json_codec import dumps, loads
from gateway.lines.output_check import OUTPUT_INVALID
from gateway.store.blobs.keys import shard_requests_key, shard_results_key
from gateway.store.order_index import entry_line
from gateway.store.protocols import Blobs, Store
from gateway.store.splitter import read_lines


async def seal_shard(
    store: Store, blobs: Blobs, shard: Shard, missing: tuple[str, str] | None,
    requests: Sequence[BatchRequest] | None = None,
) -> None:
    """Write the shard's sorted results blob from its journal, then drop the journal.

    `missing`: the (code, message) given to requests without a result (a
    cancelled or expired batch); None asserts there are none. `requests`: the
    shard's requests in input order, when the caller has them parsed already
    (the runner that just ran them); read from the shard's blob otherwise.
    """
    if await blobs.size(shard_results_key(shard)) is not None:  # sealed already (or a shard of answered lines)
        if shard.route:  # the blob written, then a crash before the seal: seal it (idempotent). The finalizer
            await store.ledger.drop_journal(shard)  # counts on it: no result counts (or costs) after its seal
            await blobs.delete(shard_requests_key(shard))
        return
    if requests is None:
        key = shard_requests_key(shard)
        requests = [BatchRequest.from_json(loads(raw)) async for raw in read_lines(blobs, key) if raw]
    done = {r.line: r for r in await store.ledger.journal(shard)}
    unrun = [r for r in requests if r.line not in done]
    if unrun:
        if missing is None:
            raise RuntimeError(f"shard {shard.key} has no result for line {unrun[0].line}")
        # Recorded like any result, so the batch's request_counts count them as failed.
        failures = [Result.failure(r.line, r.custom_id, missing[0], missing[1], model=r.model) for r in unrun]
        await store.ledger.record_results(shard, failures)
        metrics.observe_results(await metrics.team_of(store, shard.batch_id), shard.route, failures)
        # Read back for the `seq` the ledger gave each (the results endpoint's cursor counts by it).
        done = {f.line: f for f in failures} | {r.line: r for r in await store.ledger.journal(shard)}
    async with blobs.writing(shard_results_key(shard)) as writer:
        for req in requests:
            await writer.write(dumps(done[req.line].to_json()) + b"\n")
    await store.ledger.drop_journal(shard)
    # Nothing reads a sealed shard's requests (its results blob says it is done): the copy of its input lines
    # goes now, not with the batch, so the batch's working blobs never hold the whole input beside its output.
    await blobs.delete(shard_requests_key(shard))


@dataclass(slots=True)
class Summary:
    """Counts by model and status, and token totals: what a run ends with."""

    by_model: dict[str, Counter[str]] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    succeeded: int = 0
    failed: int = 0
    # By route: attempts past the first (re-runs of replies that did not match their schema), and the lines
    # still invalid after them (`output_invalid`): the batch's `routes[...]` facts, counted once, here.
    reruns: Counter[str] = field(default_factory=Counter)
    output_invalid: Counter[str] = field(default_factory=Counter)

    def add(self, result: Result, route: str = "") -> None:
        # an error of ours on a 2xx reply (`output_invalid`) is named by its code, as a line that never ran
        status = (result.error or {}).get("code", "?") if result.error or result.status_code is None \
            else str(result.status_code)
        self.by_model.setdefault(result.model or "?", Counter())[status] += 1
        self.reruns[route] += result.reruns
        self.output_invalid[route] += status == OUTPUT_INVALID
        if result.ok:
            self.succeeded += 1
            self.usage.add(result.usage)
        else:
            self.failed += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "by_model": {m: dict(c) for m, c in self.by_model.items()},
            "usage": self.usage.to_openai(),
            "succeeded": self.succeeded,
            "failed": self.failed,
        }


async def _results(blobs: Blobs, shard: Shard) -> AsyncIterator[Result]:
    async for raw in read_lines(blobs, shard_results_key(shard)):
        if raw:
            yield Result.from_json(loads(raw))


async def merge_shards(
    blobs: Blobs, shards: Sequence[Shard], output_key: str, error_key: str | None, *, run_batch_errors: bool = False,
    index_key: str | None = None,
) -> tuple[Summary, int, int]:
    """Merge sealed shards by line into `output_key` (and failures into `error_key` when given), and with
    `index_key` each result's line, seq and kind there (the results order index, `gateway.store.order_index`).

    Returns the summary and the number of lines written to each file.
    """
    summary = Summary()
    streams = [_results(blobs, s) for s in shards]
    heap: list[tuple[int, int, Result]] = []
    for i, stream in enumerate(streams):
        first = await anext(stream, None)
        if first is not None:
            heap.append((first.line, i, first))
    heapq.heapify(heap)
    n_out = n_err = 0
    async with contextlib.AsyncExitStack() as stack:
        out = await stack.enter_async_context(blobs.writing(output_key))
        err = await stack.enter_async_context(blobs.writing(error_key)) if error_key else None
        index = await stack.enter_async_context(blobs.writing(index_key)) if index_key else None
        while heap:
            _, i, result = heapq.heappop(heap)
            summary.add(result, shards[i].route)
            data = dumps(result.output_line(run_batch_errors)) + b"\n"
            if err is not None and not result.ok:
                await err.write(data)
                n_err += 1
            else:
                await out.write(data)
                n_out += 1
            if index is not None:
                await index.write(entry_line(result.line, result.seq, result.ok))
            following = await anext(streams[i], None)
            if following is not None:
                heapq.heappush(heap, (following.line, i, following))
    return summary, n_out, n_err
