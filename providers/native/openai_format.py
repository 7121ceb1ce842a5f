"""Upstream-native batches, the data side: upstream lines, parts, results back and the route summary.

Named for the format every provider's results are read back into: OpenAI's batch
lines (its own line form is here too; other providers' forms sit in their
`providers.*_jobs`). `providers.native.runner` and the `*_jobs` modules talk to the
providers; this module shapes the data and keeps the records in the store's meta:
`native:<batch_id>:<shard index>` (a shard's upstream files and batches, with
each batch's tokens and cost once read) and `cost:<batch_id>:<route>` (the
route's totals for the batch, accumulated shard by shard).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from gateway.domain import BatchRequest, Endpoint, Result, Shard, Usage
from gateway.store.protocols import Store
from gateway.store.splitter import Overlong, split_lines
from providers.retry_policy import job_call_retrying

log = logging.getLogger("batchyard.native")

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
T = TypeVar("T")


# -- calling the upstream ----------------------------------------------------------------------------

_in_flight: set[asyncio.Future[Any]] = set()


async def detached(call: Awaitable[T]) -> T:
    """Await one LiteLLM call so that cancelling us does not cut it off halfway.

    LiteLLM's async functions run the sync one in a thread, which returns a coroutine to await; cut off in the
    thread, that coroutine is never awaited (a RuntimeWarning on stderr). Shielded, the call finishes on its own.
    """
    task = asyncio.ensure_future(call)
    _in_flight.add(task)
    task.add_done_callback(_in_flight.discard)
    return await asyncio.shield(task)


async def call_with_retries(make: Callable[[], Awaitable[T]]) -> T:
    """One upstream call, detached; transient errors are retried by `providers.retry_policy.job_call_retrying`."""
    return await job_call_retrying(lambda: detached(make()))


async def upstream_file_lines(litellm: Any, file_id: str, kwargs: dict[str, Any]) -> AsyncIterator[bytes]:
    """The lines of an upstream file: streamed where LiteLLM streams (OpenAI), else one file (one part) at a time."""
    if kwargs["custom_llm_provider"] != "openai":
        reply = await call_with_retries(lambda: litellm.afile_content(file_id=file_id, **kwargs))
        for line in reply.content.splitlines():
            if line.strip():
                yield line
        return
    reply = await call_with_retries(lambda: litellm.afile_content(file_id=file_id, stream=True, **kwargs))
    stream = reply.stream_iterator
    try:
        async for line in reply_lines(stream):
            yield line
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()


# -- records ------------------------------------------------------------------------------------------


def shard_meta_key(shard: Shard) -> str:
    """Where a shard's upstream files and batches are recorded (store meta)."""
    return f"native:{shard.key}"


def cost_meta_key(batch_id: str, route: str) -> str:
    """Where a native route's totals for one batch are accumulated (store meta)."""
    return f"cost:{batch_id}:{route}"


def upstream_custom_id(line: int) -> str:
    return f"l{line}"


def line_of(custom_id: Any) -> int | None:
    """The input line an upstream custom_id stands for (None: not one of ours)."""
    if isinstance(custom_id, str) and custom_id.startswith("l") and custom_id[1:].isdigit():
        return int(custom_id[1:])
    return None


def upstream_url(endpoint: Endpoint, provider: str) -> str:
    """The url form the provider expects in lines and as the batch endpoint."""
    return endpoint.value.removeprefix("/v1") if provider == "azure" else endpoint.value


def upstream_line(req: BatchRequest, provider: str, model: str) -> bytes:
    body = {**req.body, "model": model}
    line = {"custom_id": upstream_custom_id(req.line), "method": "POST", "url": upstream_url(req.url, provider),
            "body": body}
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


@dataclass(slots=True)
class Part:
    """One upstream batch: its lines (input line numbers), ids once created, and its accounting once read."""

    endpoint: str  # the upstream endpoint (url form of the provider)
    lines: list[int]
    file_id: str | None = None
    batch_id: str | None = None
    status: str | None = None  # the upstream status, once terminal
    input_tokens: int = 0
    output_tokens: int = 0
    rerun: int = 0  # 0: a job of the shard's first pass; n: of its n-th round of re-runs (docs/output-check.md)
    created_at: float | None = None  # wall-clock seconds: when the job was made, and when it was read as ended
    ended_at: float | None = None
    cost_usd: float | None = None  # its results' and its priming's
    primed: int = 0  # real-time requests that primed a prompt cache before the job (`UpstreamJobs.prime`)
    prime_cost_usd: float | None = None  # what they cost at real-time rates (None: no price known, or none made)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Part:
        return cls(**data)


class LineForm(Protocol):
    """How a provider takes a request in its batch jobs (`providers.native.contract.UpstreamJobs` is one)."""

    def url(self, endpoint: Endpoint) -> str: ...

    def line(self, req: BatchRequest) -> bytes: ...


class _OpenAIForm:
    def __init__(self, provider: str) -> None:
        self.provider = provider

    def url(self, endpoint: Endpoint) -> str:
        return upstream_url(endpoint, self.provider)

    def line(self, req: BatchRequest) -> bytes:
        return upstream_line(req, self.provider, "m" * 64)  # a model name's length does not matter here


def plan_parts(
    requests: Sequence[BatchRequest], form: str | LineForm, max_lines: int, max_bytes: int
) -> tuple[list[Part], list[BatchRequest]]:
    """Group requests by endpoint and split them under the upstream job limits.

    `form`: the provider's line form (a provider name: OpenAI's form for it). Returns the parts and the
    requests that fit in no upstream job (one line over `max_bytes`).
    """
    shape = _OpenAIForm(form) if isinstance(form, str) else form
    parts: list[Part] = []
    too_big: list[BatchRequest] = []
    open_parts: dict[str, tuple[Part, int]] = {}  # endpoint -> (part being filled, its bytes)
    for req in requests:
        size = len(shape.line(req))
        if size > max_bytes:
            too_big.append(req)
            continue
        url = shape.url(req.url)
        current = open_parts.get(url)
        if current is None or len(current[0].lines) >= max_lines or current[1] + size > max_bytes:
            current = (Part(endpoint=url, lines=[]), 0)
            parts.append(current[0])
        current[0].lines.append(req.line)
        open_parts[url] = (current[0], current[1] + size)
    return parts, too_big


def result_from_line(obj: dict[str, Any], req: BatchRequest) -> Result:
    """One upstream output/error line as the caller's result."""
    response = obj.get("response")
    if isinstance(response, dict) and isinstance(response.get("status_code"), int):
        body = response.get("body")
        kwargs: dict[str, Any] = {"request_id": response["request_id"]} if response.get("request_id") else {}
        if isinstance(obj.get("id"), str):
            kwargs["id"] = obj["id"]
        return Result(line=req.line, custom_id=req.custom_id, status_code=response["status_code"],
                      body=body if isinstance(body, dict) else {"value": body}, model=req.model, **kwargs)
    raw_error = obj.get("error")
    error: dict[str, Any] = raw_error if isinstance(raw_error, dict) else {}
    code = str(error.get("code") or "upstream_error")
    message = str(error.get("message") or "The upstream batch gave no response for this request.")
    return Result.failure(req.line, req.custom_id, code, message, model=req.model)


_TERMINAL_ERRORS = {
    "failed": ("upstream_batch_failed", "The upstream batch {id} failed: {why}"),
    "expired": ("batch_expired", "The upstream batch {id} expired before this request ran."),
    "cancelled": ("batch_cancelled", "The upstream batch {id} was cancelled before this request ran."),
    "completed": ("upstream_result_missing", "The upstream batch {id} completed without a result for this request."),
}


def missing_result(req: BatchRequest, status: str, batch_id: str, why: str, code: str | None = None) -> Result:
    """The error result of a request that the upstream batch did not answer (`code`: the provider's own)."""
    usual, template = _TERMINAL_ERRORS.get(status, ("upstream_batch_failed", "The upstream batch {id} ended {why}"))
    return Result.failure(req.line, req.custom_id, code or usual, template.format(id=batch_id, why=why or status),
                          model=req.model)


def line_usage(obj: dict[str, Any]) -> Usage:
    """The tokens of one upstream output line (a success's usage; nothing for an error)."""
    response = obj.get("response") or {}
    status = response.get("status_code")
    ok = isinstance(status, int) and 200 <= status < 300
    return Usage.from_body(response.get("body")) if ok else Usage()


# -- route summaries ----------------------------------------------------------------------------


@dataclass(slots=True)
class RouteTotals:
    upstream_batch_ids: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    cache_primes: int = 0
    prime_cost_usd: float | None = None  # of `cost_usd`, the priming requests'

    def add_part(self, part: Part) -> None:
        if part.batch_id and part.batch_id not in self.upstream_batch_ids:
            self.upstream_batch_ids.append(part.batch_id)
        self.input_tokens += part.input_tokens
        self.output_tokens += part.output_tokens
        if part.cost_usd is not None:
            self.cost_usd = round((self.cost_usd or 0.0) + part.cost_usd, 10)
        self.cache_primes += part.primed
        if part.prime_cost_usd is not None:
            self.prime_cost_usd = round((self.prime_cost_usd or 0.0) + part.prime_cost_usd, 10)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def shard_totals(parts: Sequence[Part]) -> RouteTotals:
    totals = RouteTotals()
    for part in parts:
        totals.add_part(part)
    return totals


_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def accumulate_route(store: Store, shard: Shard) -> None:
    """Put this shard's totals into the route's `cost:<batch>:<route>` entry (idempotent: keyed by shard index).

    The entry: {"shards": {index: totals}, "upstream_batch_ids", "input_tokens", "output_tokens", "cost_usd"}.
    One process serialises its updates; `native_route_summary` is the race-free reading across workers.
    """
    meta = await store.backend_state.get(shard_meta_key(shard)) or {}
    totals = shard_totals([Part.from_json(p) for p in meta.get("parts", [])])
    key = cost_meta_key(shard.batch_id, shard.route)
    lock = _locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock:
        entry = await store.backend_state.get(key) or {"shards": {}}
        entry["shards"][str(shard.index)] = totals.to_json()
        route = RouteTotals()
        for item in entry["shards"].values():
            route.add_part(Part(endpoint="", lines=[], input_tokens=item["input_tokens"],
                                output_tokens=item["output_tokens"], cost_usd=item["cost_usd"],
                                primed=item.get("cache_primes", 0), prime_cost_usd=item.get("prime_cost_usd")))
            route.upstream_batch_ids += item["upstream_batch_ids"]
        await store.backend_state.put(key, {**entry, **route.to_json()})


async def native_route_summary(store: Store, batch_id: str, route: str) -> dict[str, Any]:
    """A native route's facts for `BatchRecord.routes[route]`, read from each of its shards' records.

    {"upstream_batch_ids": [...], "input_tokens", "output_tokens", "cost_usd"} (cost None: no price known).
    Race-free across workers: it sums the per-shard records rather than the accumulated `cost:` key.
    """
    totals = RouteTotals()
    for shard in await store.ledger.get_shards(batch_id):
        if shard.route != route:
            continue
        meta = await store.backend_state.get(shard_meta_key(shard))
        for raw in (meta or {}).get("parts", []):
            totals.add_part(Part.from_json(raw))
    return totals.to_json()


async def drop_native_state(store: Store, batch_id: str) -> None:
    """Forget a finished batch's native records (call after `native_route_summary`, at the end of finalize)."""
    routes = set()
    for shard in await store.ledger.get_shards(batch_id):
        routes.add(shard.route)
        await store.backend_state.delete(shard_meta_key(shard))
    for route in routes:
        await store.backend_state.delete(cost_meta_key(batch_id, route))


# A provider's result line longer than this is not kept (its request gets the missing-result error): the
# largest request a provider's batch takes is 256 MB, and a reply is not held past that.
MAX_REPLY_LINE = 256 << 20


async def reply_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The non-blank lines of a provider's download, split in linear time, each at most `MAX_REPLY_LINE`."""
    async for line in split_lines(chunks, MAX_REPLY_LINE):
        if isinstance(line, Overlong):
            log.warning("a provider's result line of %d bytes was dropped (over %d)", line.size, MAX_REPLY_LINE)
        elif line.strip():
            yield line
