"""Validate and plan: one streamed pass over the input file.

Each good line is appended to the open shard of its route; a shard is full
when it holds `shard_size` requests. The batch's one blob of shard lines names
each shard's lines where they are in the input file (`gateway.pipeline.shard_input`):
no copy of the input is made. Lines answered in place (the CLI's lenient mode) go,
in input order, to a pre-finished shard of results. Memory holds each open shard's
runs (one route's), each shard's place in the blob and the custom_ids (on disk past
a threshold: `gateway.pipeline.seen_ids`), never lines.

`plan_batch` plans one `PlanJob`: plain data in and out (`PlanOutcome`), so the
API's runtime runs it in a process of its own (`gateway.runtime.validation_processes`)
and `batchyard run` runs it in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.config.schema import Config
from gateway.domain import BatchRequest, Endpoint, Result, Shard
from gateway.errors import LINE_HTTP_STATUS, LineCode, LineError
from gateway.json_codec import dumps
from gateway.log_safe import escaped
from gateway.pipeline.seen_ids import SeenIds
from gateway.pipeline.shard_input import LinesWriter, ShardRuns
from gateway.pipeline.validate import LINE_SLACK, LineChecker, LineProblem, chunks, line_failure
from gateway.store.blobs.keys import shard_lines_key, shard_results_key
from gateway.store.protocols import Blobs, BlobWriter
from gateway.store.splitter import Overlong, split_lines

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class PlanOutcome:
    shards: list[Shard] = field(default_factory=list)
    answered: Shard | None = None  # the pre-finished shard of per-line errors, if any
    # Its lines by HTTP status, counted as they are written: nobody reads the shard back to count them.
    answered_statuses: Counter[str] = field(default_factory=Counter)
    errors: list[LineError] = field(default_factory=list)  # fatal (or, strict, all) problems, capped
    error_count: int = 0
    total: int = 0  # requests, including those answered in place
    models: set[str] = field(default_factory=set)

    @property
    def failed(self) -> bool:
        return self.error_count > 0


@dataclass(frozen=True, slots=True)
class PlanJob:
    """What planning a batch needs besides the config and the blobs; picklable, for another process."""

    batch_id: str
    input_key: str  # the input file's blob
    endpoint: Endpoint | None  # the batch's endpoint; None: any url (the CLI)
    strict: bool
    allowed_models: list[str] | None
    # the validating stage's span (`gateway.tracing`), so that the validation process plans in the batch's trace
    trace_context: dict[str, str] | None = None
    # the lines the file may have: its team's `max_lines`, else `batch_settings.max_lines`
    max_lines: int | None = None


async def plan_batch(config: Config, blobs: Blobs, job: PlanJob) -> PlanOutcome:
    """Validate the job's input file into shards (their lines' places, a blob of results of lines answered in
    place), streamed; the outcome says what was written."""
    planner = Planner(config, blobs, job.batch_id, job.input_key, endpoint=job.endpoint, strict=job.strict,
                      allowed_models=job.allowed_models, max_lines=job.max_lines)
    # A line is cut off while it is read, once it passes the limit: it never sits whole in memory.
    cap = config.batch.limits.max_line_bytes + LINE_SLACK
    return await planner.plan(split_lines(blobs.read(job.input_key), cap))


@dataclass(slots=True)
class _OpenShard:
    shard: Shard
    runs: ShardRuns  # where its lines are in the input


class _Discard(Exception):
    """The plan failed: leave the writing block so that the blobs it was writing are aborted."""


Checked = BatchRequest | LineError | LineProblem
# A checked line: its number, what the check made of it, and its bytes [start, end) in the input file.
Placed = tuple[int, Checked, int, int]


class OneThread:
    """The thread a pass over a file checks its chunks in (`chunks`), its own and only one. The loop's default
    executor spread them over its threads, and each grew a malloc arena of its own: validation's peak RSS at
    200,000 lines was 94 MiB that way, 78 MiB in one thread."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="batchyard-chunks")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the thread, in the caller's context (as `asyncio.to_thread`)."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """Stop the thread once a chunk it is checking is done (a cancelled pass does not wait for it)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class Planner:
    def __init__(
        self, config: Config, blobs: Blobs, batch_id: str, input_key: str, *, endpoint: Endpoint | None,
        strict: bool,
        allowed_models: list[str] | None, run_batch_rules: bool | None = None, max_lines: int | None = None,
        seen: SeenIds | None = None,
    ) -> None:
        """`input_key`: the blob the lines are read from (each shard names its lines there). `run_batch_rules`:
        repeated custom_ids are answered line by line, as vLLM's run_batch does
        (default: what the config says, i.e. true only for the config `batchyard run --model` implies).
        `max_lines`: the file's limit (default: `batch_settings.max_lines`). `seen`: where the custom_ids are
        kept (`LineChecker`'s default), closed when the plan ends."""
        self._config, self._blobs, self._batch_id, self._strict = config, blobs, batch_id, strict
        self._input_key = input_key
        self._max_lines = max_lines or config.batch.limits.max_lines
        if run_batch_rules is None:
            run_batch_rules = config.run_batch_rules
        self._checker = LineChecker(
            config, endpoint=endpoint, allowed_models=allowed_models, allow_duplicates=run_batch_rules, seen=seen
        )
        self._open: dict[str, _OpenShard] = {}
        self._answered: Shard | None = None  # the shard of lines answered in place, and its results' writer
        self._answered_writer: BlobWriter | None = None
        self._lines: LinesWriter | None = None  # the batch's blob of shard lines, while the plan writes it
        self._next_index = 0
        self._wildcard_models: set[str] = set()  # concrete models of wildcard routes the batch names so far
        self._wildcard_per_route: dict[str, int] = {}  # of them, per pattern
        # The blobs the plan writes: committed when it ends, aborted when it fails (`plan`).
        self._writing: contextlib.AsyncExitStack | None = None
        self._checking = OneThread()
        self.outcome = PlanOutcome()

    def _new_shard(self, route: str) -> Shard:
        shard = Shard(self._batch_id, self._next_index, route, 0)
        self._next_index += 1
        return shard

    def _fail(self, error: LineError) -> None:
        self.outcome.error_count += 1
        if len(self.outcome.errors) < self._config.batch.limits.max_errors_listed:
            self.outcome.errors.append(error)

    async def plan(self, lines: AsyncIterator[bytes | Overlong]) -> PlanOutcome:
        try:
            async with contextlib.AsyncExitStack() as writing:
                self._writing = writing
                lines_writer = await writing.enter_async_context(self._blobs.writing(shard_lines_key(self._batch_id)))
                self._lines = LinesWriter(lines_writer, self._input_key)
                await self._read(lines)
                if self.outcome.failed:
                    raise _Discard
                # The shards still open, then the index; leaving the block commits the blobs.
                for open_ in self._open.values():
                    await self._lines.add(open_.shard.index, open_.runs)
                    self.outcome.shards.append(open_.shard)
                await self._lines.close(self._next_index)
                self.outcome.answered = self._answered
        except _Discard:
            pass
        finally:  # a plan that stops early (a failed file, an error, a cancel) frees the ids' disk too
            self._checking.close()
            self._checker.close()
            self._writing = self._lines = self._answered_writer = self._answered = None
        self._open.clear()
        self.outcome.shards.sort(key=lambda s: s.index)
        return self.outcome

    async def _read(self, lines: AsyncIterator[bytes | Overlong]) -> None:
        max_lines = self._max_lines
        number = offset = 0  # lines read so far, and their bytes (newlines included)
        async for chunk in chunks(lines):
            # The CPU work (JSON, checks, the shard line's bytes) in a thread, so that a process planning in
            # place (`batchyard run`, a worker's sweep) keeps its event loop turning. The API's runtime plans in
            # a process of its own: a thread still holds the GIL against the API's loop. Lines keep their numbers.
            checked_chunk, offset = await self._checking.run(self._check_chunk, chunk, number, offset)
            number += len(chunk)
            for line, checked, start, end in checked_chunk:
                self.outcome.total += 1
                if self.outcome.total > max_lines:
                    self._fail(LineError(LineCode.TOO_MANY_TASKS,
                                         f"the file has more than {max_lines} requests", line))
                    return self._finish_read()
                if (error := line_failure(checked, self._strict)) is not None:
                    self._fail(error)
                elif isinstance(checked, LineProblem):
                    await self._answer(checked)
                elif isinstance(checked, BatchRequest):
                    self.outcome.models.add(checked.model)
                    route = self._route_name(checked.model)
                    if (bound := self._wildcard_bound(route)) is not None:
                        self._fail(LineError(LineCode.INVALID_REQUEST, bound, line, "body.model"))
                        return self._finish_read()
                    await self._append(route, line, start, end)
        return self._finish_read()

    def _finish_read(self) -> None:
        if self.outcome.total == 0 and not self.outcome.failed:
            # Kept in run_batch mode too: `batchyard run --model` answers an empty file before planning.
            self._fail(LineError(LineCode.EMPTY_FILE, "the file contains no requests"))
        if self._checker.repeats and not self.outcome.failed:
            cid, line = self._checker.first_repeat or ("", 0)
            log.warning(
                "%d line(s) repeat a custom_id seen before (first: %r on line %d); each is answered in its "
                "own input position, as vLLM's run_batch does", self._checker.repeats, escaped(cid), line,
            )

    def _check_chunk(self, chunk: list[bytes | Overlong], before: int, offset: int) -> tuple[list[Placed], int]:
        """Check lines `before + 1`…, the first at byte `offset` of the input (blank ones are left out); with
        the offset of the line after the chunk."""
        out: list[Placed] = []
        for line, raw in enumerate(chunk, start=before + 1):
            start, offset = offset, offset + (len(raw) if isinstance(raw, bytes) else raw.size) + 1
            checked: Checked | None
            try:
                checked = self._checker.check(raw, line)
            except Exception:  # a line the checks did not foresee is that line's error, not the batch's end
                log.exception("checking line %d of batch %s failed", line, self._batch_id)
                checked = LineError(LineCode.INVALID_REQUEST, "This line could not be checked.", line)
            if checked is not None:
                out.append((line, checked, start, offset - 1))
        return out, offset

    def _wildcard_bound(self, route_name: str) -> str | None:
        """Why a line of `route_name` takes the batch past its bound on a wildcard route's concrete models
        (`max_wildcard_models`, `max_wildcard_models_per_route`); None: within them. Each is a route of its
        own (shards, metrics, caches): the bound keeps one file from making them without end."""
        if route_name in self._open or route_name in self._wildcard_models:
            return None
        route = self._config.route(route_name)
        if route is None or route.group is None:
            return None
        settings = self._config.batch
        per_route = self._wildcard_per_route.get(route.group, 0)
        if per_route >= settings.max_wildcard_models_per_route:
            return (f"the batch names more than {settings.max_wildcard_models_per_route} models through the wildcard "
                    f"route {route.group!r} (batch_settings.max_wildcard_models_per_route)")
        if len(self._wildcard_models) >= settings.max_wildcard_models:
            return (f"the batch names more than {settings.max_wildcard_models} models through wildcard routes "
                    "(batch_settings.max_wildcard_models)")
        self._wildcard_models.add(route_name)
        self._wildcard_per_route[route.group] = per_route + 1
        return None

    def _route_name(self, model: str) -> str:
        """The shard route of a checked line: its route's model_name (an alias's target; a wildcard route's
        concrete model, so each model a wildcard serves has its own shards, counts and costs)."""
        route = self._config.route(model)
        assert route is not None  # the checker let the line through: its model has a route
        return route.model_name

    async def _append(self, route: str, line: int, start: int, end: int) -> None:
        if self.outcome.failed:
            return  # keep validating, but stop writing shards nobody will run
        open_ = self._open.get(route)
        if open_ is None:
            open_ = self._open[route] = _OpenShard(self._new_shard(route), ShardRuns())
        open_.runs.add(line, start, end)
        open_.shard.size += 1
        if open_.shard.size >= self._config.batch.shard_size:
            del self._open[route]
            assert self._lines is not None  # set while the plan reads
            await self._lines.add(open_.shard.index, open_.runs)
            self.outcome.shards.append(open_.shard)

    async def _answer(self, problem: LineProblem) -> None:
        if self.outcome.failed:
            return
        status, type_ = LINE_HTTP_STATUS[problem.error.code]
        result = Result.http_error(
            problem.error.line or 0, problem.custom_id, status, problem.error.message, type_=type_,
            code=problem.error.code.value, model=problem.model,
            # a body field is named as the endpoint's own 400 names it ('input', not 'body.input')
            param=(problem.error.param or "").removeprefix("body.") or None
            if problem.error.code in (LineCode.MISSING_REQUIRED_PARAMETER, LineCode.INVALID_TYPE) else None,
        )
        if self._answered is None or self._answered_writer is None:
            assert self._writing is not None  # set while the plan reads
            self._answered = self._new_shard("")
            self._answered_writer = await self._writing.enter_async_context(
                self._blobs.writing(shard_results_key(self._answered)))
        await self._answered_writer.write(dumps(result.to_json()) + b"\n")
        self._answered.size += 1
        self.outcome.answered_statuses[str(status)] += 1
