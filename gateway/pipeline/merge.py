"""Sealing shards and merging them into the output files, in input order.

`seal_shard` turns one shard's journal into a results blob sorted by line
(memory: one shard), reading its requests where its lines are in the input
(`gateway.pipeline.shard_input`) when it has none in hand. `merge_shards` k-way merges the sealed shards by line
number into the output file and, optionally, a separate error file (memory:
one line per shard), in segments, deleting each shard's results once they are merged (disk: the output and
about one segment beside it), resumable after a crash (`gateway.pipeline.checkpoint`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway import metrics
from gateway.domain import BatchRequest, Result, Shard, Usage
from gateway.json_codec import dumps, loads
from gateway.lines.output_check import OUTPUT_INVALID
from gateway.pipeline import checkpoint
from gateway.pipeline.checkpoint import MergeCheckpoint
from gateway.pipeline.shard_input import first_line, read_requests
from gateway.store.blobs.keys import merge_checkpoint_key, segment_key, shard_requests_key, shard_results_key
from gateway.store.order_index import IndexWriter
from gateway.store.protocols import Blobs, Store
from gateway.store.splitter import read_lines

# A segment of the merged files ends at the first shard finished past this many bytes of output: the shards
# beside the output while it is merged are about this much, and one segment per shard or so is written.
SEGMENT_BYTES = 1 << 20



class ResultsLost(RuntimeError):
    """A shard's store holds no result for a line its runner finished (a Redis restarted from an append-only
    file that missed its last second of writes): not sealed, the shard runs again for the lines it lacks."""

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
            await blobs.delete(shard_requests_key(shard))  # an earlier version's blob of the shard's lines
        return
    if requests is None:
        requests = await read_requests(blobs, shard)
        if requests is None:  # no results, and its lines are gone or merged: sealed and merged already
            return
    done = {r.line: r for r in await store.ledger.journal(shard)}
    unrun = [r for r in requests if r.line not in done]
    if unrun:
        if missing is None:
            raise ResultsLost(f"shard {shard.key} has no result for line {unrun[0].line}")
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
    # A shard planned by an earlier version has a blob of its own (`shard_input`): it goes now, not with the
    # batch. The batch's one blob of shard lines stays until the batch ends.
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
    n_out: int = 0  # lines written to the output file, and to the error file (when split)
    n_err: int = 0

    def state(self) -> dict[str, Any]:
        """Everything counted so far, as JSON (a merge's checkpoint keeps it: `from_state`)."""
        return {"by_model": {m: dict(c) for m, c in self.by_model.items()}, "usage": dataclasses.asdict(self.usage),
                "succeeded": self.succeeded, "failed": self.failed, "reruns": dict(self.reruns),
                "output_invalid": dict(self.output_invalid), "n_out": self.n_out, "n_err": self.n_err}

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> Summary:
        if not data:
            return cls()
        return cls({m: Counter(c) for m, c in data["by_model"].items()}, Usage(**data["usage"]), data["succeeded"],
                   data["failed"], Counter(data["reruns"]), Counter(data["output_invalid"]), data["n_out"],
                   data["n_err"])

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


async def _results(blobs: Blobs, shard: Shard, skip: int) -> AsyncIterator[Result]:
    """The shard's sealed results in line order, past the first `skip` (merged before a restart)."""
    async for raw in read_lines(blobs, shard_results_key(shard)):
        if raw:
            if skip:
                skip -= 1
                continue
            yield Result.from_json(loads(raw))


async def merged_shards(blobs: Blobs, batch_id: str) -> set[int]:
    """The shards of the batch whose results a merge under way has merged and deleted: not to be sealed again."""
    return (await checkpoint.load(blobs, merge_checkpoint_key(batch_id))).merged


async def merge_shards(
    blobs: Blobs, shards: Sequence[Shard], output_key: str, error_key: str | None, *, run_batch_errors: bool = False,
    index_key: str | None = None, checkpoint_key: str, segment_bytes: int = SEGMENT_BYTES,
) -> tuple[Summary, int, int]:
    """Merge sealed shards by line into `output_key` (and failures into `error_key` when given), and with
    `index_key` each result's line, seq and kind there (the results order index, `gateway.store.order_index`).

    Written in segments (`keys.segment_key`): one ends at the first shard it finished once it holds
    `segment_bytes` of output, then the checkpoint at `checkpoint_key` says so (`gateway.pipeline.checkpoint`)
    and the shards it finished are deleted. Each key is then read as its segments (`Blobs.compose`). The disk
    holds the merged output and about one segment of shards beside it; a merge that died goes on from its
    checkpoint. Returns the summary and the number of lines written to each file.
    """
    state = await checkpoint.load(blobs, checkpoint_key)
    targets = _targets(output_key, error_key, index_key)
    summary = Summary.from_state(state.summary)
    if not state.composed:
        await _merge(blobs, [s for s in shards if s.index not in state.merged], targets, state, summary,
                     run_batch_errors, checkpoint_key, segment_bytes)
        for name, key in targets.items():
            sizes = state.sizes.get(name, [])
            joined = await blobs.compose(key, [(segment_key(key, n), size) for n, size in enumerate(sizes)])
            if joined != key:  # a manifest of the segments: they stay its bytes
                state.sizes[name] = []
        state.composed = True
        await checkpoint.save(blobs, checkpoint_key, state)
    for name, key in targets.items():  # joined into one object (S3): the segments go
        for n in range(len(state.sizes.get(name, []))):
            await blobs.delete(segment_key(key, n))
    return summary, summary.n_out, summary.n_err


async def _chain(blobs: Blobs, shards: Sequence[Shard], state: MergeCheckpoint,
                 drained: list[Shard]) -> AsyncGenerator[tuple[Shard, Result, bool], None]:
    """One route's shards, in index order, as one stream of (shard, result, whether it is the shard's last).

    The planner fills a route's shards one after another, so each one's lines follow the last one's: only one
    shard of a route is open at a time, and the merge holds a read buffer per route, not one per shard (a
    4,000-shard batch would hold 4,000). A shard with nothing left to merge goes to `drained`."""
    previous = 0
    for shard in shards:
        pending: Result | None = None
        async for result in _results(blobs, shard, state.read.get(shard.index, 0)):
            if result.line <= previous:
                raise RuntimeError(f"shard {shard.key}: line {result.line} after line {previous} of its route")
            previous = result.line
            if pending is not None:
                yield shard, pending, False
            pending = result
        if pending is None:
            drained.append(shard)
        else:
            yield shard, pending, True


async def advance_merge(
    blobs: Blobs, shards: Sequence[Shard], output_key: str, error_key: str | None, *, run_batch_errors: bool = False,
    index_key: str | None = None, checkpoint_key: str, min_bytes: int = SEGMENT_BYTES,
    segment_bytes: int = SEGMENT_BYTES,
) -> bool:
    """While the batch runs: merge what can be merged already, as `merge_shards` does, without its end.

    The shards sealed before the first one still open (by index) hold every line before that shard's first
    line: the planner opens shards as their lines come, so a later shard's lines come later. Those lines are
    merged into segments once the sealed shards hold `min_bytes` of results, and the shards merged whole are
    deleted: the disk holds the output so far and about `min_bytes` of results beside it, not every shard
    sealed until the last one ends. The finalizer's `merge_shards` goes on from the same checkpoint. Returns
    whether anything was merged. The caller holds the batch's finalize lease: one merge at a time.
    """
    state = await checkpoint.load(blobs, checkpoint_key)
    if state.composed:
        return False
    ready: list[Shard] = []
    held = 0
    for shard in sorted(shards, key=lambda s: s.index):
        if shard.index in state.merged:
            continue
        size = await blobs.size(shard_results_key(shard))
        if size is None:  # still open: the merge stops before its first line
            if held < min_bytes or (stop := await first_line(blobs, shard)) is None:
                return False
            targets = _targets(output_key, error_key, index_key)
            return await _merge(blobs, ready, targets, state, Summary.from_state(state.summary), run_batch_errors,
                                checkpoint_key, segment_bytes, stop=stop)
        ready.append(shard)
        held += size
    return False  # every shard sealed: the finalizer's merge does the rest


def _targets(output_key: str, error_key: str | None, index_key: str | None) -> dict[str, str]:
    """The merge's files by name: the output, and the error file and the order index where there are."""
    return {"out": output_key, **({"err": error_key} if error_key else {}),
            **({"index": index_key} if index_key else {})}


async def _merge(blobs: Blobs, shards: Sequence[Shard], targets: dict[str, str], state: MergeCheckpoint,
                 summary: Summary, run_batch_errors: bool, checkpoint_key: str, segment_bytes: int,
                 stop: int | None = None) -> bool:
    """Merge into segments from `state` on; with `stop`, only the lines before it (the rest stay for later).
    Returns whether a segment was written."""
    routes: dict[str, list[Shard]] = {}
    for shard in sorted(shards, key=lambda s: s.index):
        routes.setdefault(shard.route, []).append(shard)
    drained: list[Shard] = []
    chains = [_chain(blobs, group, state, drained) for group in routes.values()]
    heap: list[tuple[int, int, Shard, Result, bool]] = []
    for i, chain in enumerate(chains):
        if (first := await anext(chain, None)) is not None:
            heap.append((first[1].line, i, *first))
    heapq.heapify(heap)

    try:
        return await _segments(blobs, chains, heap, drained, targets, state, summary, run_batch_errors,
                                checkpoint_key, segment_bytes, stop)
    finally:  # a merge stopped early leaves its chains mid-shard: their files close now, not at collection
        for chain in chains:
            await chain.aclose()


async def _segments(blobs: Blobs, chains: list[AsyncGenerator[tuple[Shard, Result, bool], None]],
                    heap: list[tuple[int, int, Shard, Result, bool]], drained: list[Shard], targets: dict[str, str],
                    state: MergeCheckpoint, summary: Summary, run_batch_errors: bool, checkpoint_key: str,
                    segment_bytes: int, stop: int | None) -> bool:
    """Write segments from the heap of the chains' next results until they run out, or `stop` is next."""

    def blocked() -> bool:  # the next line waits for a shard still open
        return stop is not None and (not heap or heap[0][0] >= stop)

    wrote = False
    while heap or drained or state.segments == 0:  # one segment at least: an empty batch has (empty) files too
        if blocked() and not drained:
            break
        number, finished = state.segments, []
        sizes = dict.fromkeys(targets, 0)
        async with contextlib.AsyncExitStack() as stack:
            writers = {name: await stack.enter_async_context(blobs.writing(segment_key(key, number)))
                       for name, key in targets.items()}
            index = IndexWriter()  # a gzip member of its own per segment: the segments are joined as they are
            while heap and not blocked():
                _, i, shard, result, last = heapq.heappop(heap)
                summary.add(result, shard.route)
                data = dumps(result.output_line(run_batch_errors)) + b"\n"
                where = "err" if "err" in writers and not result.ok else "out"
                await writers[where].write(data)
                sizes[where] += len(data)
                if where == "err":
                    summary.n_err += 1
                else:
                    summary.n_out += 1
                if "index" in writers and (packed := index.add(result.line, result.seq, result.ok)):
                    await writers["index"].write(packed)
                    sizes["index"] += len(packed)
                state.read[shard.index] = state.read.get(shard.index, 0) + 1
                if (following := await anext(chains[i], None)) is not None:
                    heapq.heappush(heap, (following[1].line, i, *following))
                if last:
                    finished.append(shard)
                    if sizes["out"] + sizes.get("err", 0) >= segment_bytes:
                        break
            if "index" in writers and (packed := index.end()):
                await writers["index"].write(packed)
                sizes["index"] += len(packed)
        finished += drained
        drained.clear()
        for name, size in sizes.items():
            state.sizes.setdefault(name, []).append(size)
        state.segments = number + 1
        for shard in finished:
            state.merged.add(shard.index)
            state.read.pop(shard.index, None)
        state.summary = summary.state()
        await checkpoint.save(blobs, checkpoint_key, state)
        for shard in finished:  # merged whole into a written segment: the checkpoint says so
            await blobs.delete(shard_results_key(shard))
        wrote = True
    return wrote
