"""Upstream-native batches: a route's shards forwarded as provider batch jobs, at batch prices.

A deployment marked `model_info: {batch_mode: native}` gets no call per line.
Each shard is rewritten for the provider (its line form, the deployment's model,
custom_id `l<line>`), split under the provider's job limits and made into upstream
jobs by that provider's `UpstreamJobs` (each `*_jobs` module here, found by `providers.native.catalog`).
The file and job ids are recorded in the store's meta (`native:<batch>:<shard>`)
before any polling, so a restarted process polls the jobs it already created instead of
creating new ones. Before a job is created its lines' estimated cost is reserved of the team's budget
(`gateway.lines.reservation`): the lines that do not fit get `budget_exceeded`, as on a real-time route, and
the hold goes once the job's results are recorded. Jobs are polled with backoff and read back as OpenAI-shaped
result lines; every request gets exactly one `Result`. When the shard runner
cancels a shard because our batch was cancelled or expired, the upstream jobs are
cancelled too; a process shutdown leaves them running, to be picked up on restart. A shard's replies that do
not match their schema are re-run as the shard's round `rerun` (`execute_shard`): its jobs are parts of that round,
made and recorded as the first pass's are, or its lines run in real time when the batch's window leaves no time
for a job (`providers.native.invalid_replies`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from gateway import tracing
from gateway.config.entries import NativeModelInfo
from gateway.config.priced_fields import priced_fields
from gateway.config.prices import Prices, batch_prices, cost_of, realtime_prices
from gateway.config.routes import Route
from gateway.domain import BatchRequest, Endpoint, Result, Shard, Usage, new_id
from gateway.lines.body_fields import unknown_field, unrecognized, unsupported, upstream_fields
from gateway.lines.budget import release_now, settled_now
from gateway.lines.media_urls import internal_deployment, refused_media
from gateway.lines.reservation import holder, reserve_job
from gateway.lines.stops import OVER_BUDGET, stop_reason
from gateway.log_safe import escaped
from gateway.store.protocols import Store
from gateway.tracing import genai
from providers.native.cache_priming import primed, with_priming
from providers.native.catalog import jobs_class, native_catalog
from providers.native.contract import JobState, UpstreamJobs, call_kwargs
from providers.native.invalid_replies import Realtime, job_fits
from providers.native.job_limits import job_limits
from providers.native.openai_format import (
    TERMINAL,
    Part,
    accumulate_route,
    call_with_retries,
    drop_native_state,
    line_of,
    line_usage,
    missing_result,
    native_route_summary,
    plan_parts,
    result_from_line,
    shard_meta_key,
)
from providers.passthrough import PROVIDERS as WIRE_PROVIDERS
from providers.upstream_errors import describe_error, retryable

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

log = logging.getLogger("batchyard.native")

_MAX_POLL_ERRORS = 10  # consecutive transient polling errors before a part's requests get error results
_CANCEL_TIMEOUT = 15.0
_REALTIME_CONCURRENCY = 16  # calls at once for the lines of a part below a provider's minimum job size


def _job_attributes(jobs: UpstreamJobs, shard: Shard) -> dict[str, Any]:
    """A native job call's span attributes (gateway.tracing): the provider, our batch and shard."""
    return {genai.PROVIDER_NAME: genai.provider_name(jobs.provider), genai.BATCH_ID: shard.batch_id,
            genai.SHARD: shard.index}


class NativeBatchBackend:
    """Runs one native route's shards as upstream batch jobs (`ShardAwareBackend`)."""

    def __init__(self, route: Route, router_settings: dict[str, Any], store: Store) -> None:
        self.route = route
        self._store = store
        info = route.model_info
        if not isinstance(info, NativeModelInfo):  # the config gives every native entry one
            raise TypeError(f"{route.model_name} is a {route.kind.value} route, not a native one")
        self._max_lines = info.native_max_lines  # None: the provider's own limit
        self._max_bytes = info.native_max_bytes
        self._poll_max = info.native_poll_max_seconds
        self._poll_first = min(info.native_poll_initial_seconds, self._poll_max)
        self._timeout = router_settings.get("timeout")
        self._realtime = Realtime(route, router_settings)  # re-runs with no time left for a follow-up job
        self._litellm: Any = None
        # a deployment pointed at an operator's own server fetches media from inside (gateway.lines.media_urls)
        self._internal = any(internal_deployment(e.litellm_params.model_dump()) for e in route.entries)

    @property
    def endpoints(self) -> frozenset[Endpoint]:
        """What every deployment's provider takes in its batch jobs."""
        served: frozenset[Endpoint] | None = None
        for entry in self.route.entries:
            cls = jobs_class(entry.litellm_params.model.partition("/")[0])
            mine = cls.endpoints if cls is not None else frozenset()
            served = mine if served is None else served & mine
        return served or frozenset()

    async def start(self) -> None:
        if self._litellm is None:
            import litellm

            litellm.suppress_debug_info = True
            self._litellm = litellm

    async def aclose(self) -> None:
        await self._realtime.aclose()

    async def _refusal(self, req: BatchRequest, provider: str) -> Result | None:
        """A line whose body holds more than the endpoint's documented fields and the route's extras gets its
        400 here, as on real-time routes; so does a media URL that LiteLLM's translation would fetch."""
        # A batch job is priced at batch rates only: nothing here counts a region, a speed or a server tool.
        # `service_tier` is left to the provider: a batch runs at its own batch tier, whatever a line asks.
        charges = [c for c in priced_fields(req.url, req.body) if c.name != "service_tier"]
        if charges:
            return unsupported(req, charges[0].param, "it changes what the provider charges, and a native batch "
                               "route prices tokens at batch rates only; send it to a realtime route that allows it")
        name = unknown_field(req.body, upstream_fields(req.url) | self.route.allowed_params)
        if name is not None:
            return unrecognized(req, name)
        if provider in WIRE_PROVIDERS and not self._internal:
            return None  # the job file goes to a public provider as written: it fetches media itself
        return await refused_media(req, req.body, self.route.allowed_media_domains)

    # -- the deployment -------------------------------------------------------------------------

    def _deployment(self, index: int) -> tuple[UpstreamJobs | None, str, Prices | None]:
        """(the provider's jobs, the provider's name, batch prices) of deployment `index`."""
        entry = self.route.entries[index % len(self.route.entries)]
        params = entry.litellm_params.model_dump()  # LiteLLM's keyword arguments, as written
        provider, _, model = entry.litellm_params.model.partition("/")
        info = entry.model_info.litellm_keys
        candidates = [info.get("base_model") or "", entry.litellm_params.model, model]
        cls = jobs_class(provider)
        prices = batch_prices(info, self._litellm.model_cost, candidates, cls.batch_discount if cls else 0.5)
        native_info = entry.model_info
        if cls is None or not isinstance(native_info, NativeModelInfo):
            return None, provider, prices
        jobs = cls(self._litellm, provider, model, call_kwargs(params, cls, provider, self._timeout), native_info)
        return jobs, provider, prices

    def _realtime_prices(self, index: int) -> Prices | None:
        """Deployment `index`'s real-time prices: what a request before its job costs (`UpstreamJobs.prime`)."""
        entry = self.route.entries[index % len(self.route.entries)]
        info = entry.model_info.litellm_keys
        candidates = [info.get("base_model") or "", entry.litellm_params.model,
                      entry.litellm_params.model.partition("/")[2]]
        return realtime_prices(info, self._litellm.model_cost, candidates)

    # -- the Backend interface --------------------------------------------------------------------

    async def route_summary(self, batch_id: str, route: str) -> dict[str, Any]:
        """`RouteReporter`: upstream batch ids, tokens and batch-rate cost of the route in a batch."""
        return await native_route_summary(self._store, batch_id, route)

    async def forget_batch(self, batch_id: str) -> None:
        await drop_native_state(self._store, batch_id)

    async def execute(self, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]:
        """Without a shard: a synthetic one, forgotten once every result is out."""
        shard = Shard(batch_id=new_id("native"), index=0, route=self.route.model_name, size=len(requests))
        async for result in self.execute_shard(shard, requests):
            yield result
        await self._store.backend_state.delete(shard_meta_key(shard))

    async def execute_shard(self, shard: Shard, requests: Sequence[BatchRequest],
                            rerun: int = 0) -> AsyncIterator[Result]:
        """`rerun`: 0 for the shard's first pass; n for its n-th round of re-runs (replies that did not match
        their schema), whose jobs are recorded beside the first pass's as parts of that round."""
        await self.start()
        by_line = {r.line: r for r in requests}
        key = shard_meta_key(shard)
        state = await self._store.backend_state.get(key) or {"deployment": shard.index % len(self.route.entries)}
        jobs, provider, prices = self._deployment(int(state["deployment"]))
        if jobs is None:  # the config refuses these at load; a route built by hand may still hold one
            message = f"native batches need a deployment of {', '.join(sorted(native_catalog()))}, not {provider}/"
            for req in requests:
                yield Result.failure(req.line, req.custom_id, "native_unsupported", message, model=req.model)
            return
        for req in requests:
            if req.url not in jobs.endpoints:
                where = ("; Anthropic's Messages run natively on anthropic/ deployments, in real time on any"
                         if req.url is Endpoint.MESSAGES else "")
                yield Result.http_error(req.line, req.custom_id, 400, f"{req.url.value} is not supported in "
                                        f"{provider} batches{where}", type_="invalid_request_error",
                                        code="unsupported_endpoint", model=req.model)
        recorded = [Part.from_json(p) for p in state.get("parts", [])]
        others = [p for p in recorded if p.rerun != rerun]  # another round's jobs: kept, never polled here
        parts = [p for p in recorded if p.rerun == rerun]
        parts = [p for p in parts if p.batch_id or (p.file_id and await self._find(jobs, p))]
        if rerun and not parts and not await job_fits(self._store, shard, others, rerun):
            async for result in self._realtime.execute(requests):  # no time left for a job: real time
                yield result
            return
        covered = {line for p in parts for line in p.lines}
        fresh = []
        for req in requests:
            if req.line in covered or req.url not in jobs.endpoints:
                continue
            rejected = await self._refusal(req, provider) or jobs.reject(req)
            if rejected is not None:
                yield rejected
            else:
                fresh.append(req)
        own = job_limits(provider)  # the deployment's own bounds, else the provider's
        max_lines = self._max_lines or own.max_lines
        max_bytes = self._max_bytes or own.max_bytes
        new_parts, too_big = plan_parts(fresh, jobs, max_lines, max_bytes)
        for part in new_parts:
            part.rerun = rerun
        for req in too_big:
            yield Result.failure(req.line, req.custom_id, "request_too_large",
                                 f"the request is larger than the upstream job limit of {max_bytes} bytes",
                                 model=req.model)
        small = [line for p in new_parts if len(p.lines) < jobs.min_lines for line in p.lines]
        if small:  # a provider's minimum job size (Bedrock's records per job)
            new_parts = [p for p in new_parts if len(p.lines) >= jobs.min_lines]
            for start in range(0, len(small), _REALTIME_CONCURRENCY):  # too few for a job: answered in real time
                chunk = small[start:start + _REALTIME_CONCURRENCY]      # on the same deployment, never failed
                for result in await asyncio.gather(*(jobs.realtime(by_line[line]) for line in chunk)):
                    yield result
        parts += new_parts

        async def save() -> None:
            await self._store.backend_state.put(
                key, {"deployment": state["deployment"], "parts": [p.to_json() for p in [*others, *parts]]})

        pending: list[Part] = []  # created, not yet finished
        try:
            for i, part in enumerate(parts):
                if not any(line in by_line for line in part.lines):
                    continue  # every request of it is recorded already
                if part.batch_id is None:
                    # A job is money committed: its lines' estimate is reserved first, and those past the budget
                    # are not sent.
                    part.lines = [line for line in part.lines if line in by_line]
                    hold = holder(shard, part.lines[0], rerun)
                    fit = await reserve_job(hold, self.route, prices, [by_line[line] for line in part.lines])
                    for line in part.lines[fit:]:
                        yield Result.failure(line, by_line[line].custom_id, *OVER_BUDGET, model=by_line[line].model)
                    part.lines = part.lines[:fit]
                    if not part.lines:
                        continue
                    failure = await self._create(jobs, shard, i, part, by_line, save, int(state["deployment"]))
                    if failure is not None:
                        await release_now(hold)
                        for line in part.lines:
                            if line in by_line:
                                req = by_line[line]
                                yield with_priming(part, Result.failure(
                                    line, req.custom_id, "upstream_batch_failed", failure, model=req.model))
                        continue
                pending.append(part)
            jobs.release()  # what was kept to make the jobs (`TranslatedLines`' translations) is in them now
            async for result in self._poll(jobs, shard, pending, by_line, prices, save):
                yield result
        except (asyncio.CancelledError, GeneratorExit):
            # Cancelled while waiting (the shard runner cancels the consuming task), or closed while suspended.
            await asyncio.shield(self._cancel_if_stopped(jobs, shard, parts))
            raise

    # -- create ------------------------------------------------------------------------------

    async def _create(
        self, jobs: UpstreamJobs, shard: Shard, index: int, part: Part, by_line: dict[int, BatchRequest],
        save: Callable[[], Awaitable[None]], deployment: int,
    ) -> str | None:
        """Make the part's upstream job, recording each id as soon as it exists; first, the real-time calls that
        prime a prompt cache its requests share (`UpstreamJobs.prime`), their cost recorded in the part.

        Returns None on success, else the reason (the part's requests get error results)."""
        part.lines = [line for line in part.lines if line in by_line]  # never resend a recorded request
        data = b"".join(jobs.line(by_line[line]) for line in part.lines)
        # before the job: its requests read the cache these write
        if primed(part, await jobs.prime(data), lambda: self._realtime_prices(deployment)):
            log.info("native shard %s: primed %d shared prompt prefixes", shard.key, part.primed)
        tag = f"r{part.rerun}-{index}" if part.rerun else str(index)  # a follow-up job's name is its own
        name = f"batchyard-{shard.batch_id}-{shard.index}-{tag}.jsonl"
        metadata = {"batchyard_shard": shard.key, "batchyard_part": tag}
        try:
            with tracing.client_span("batch_job.create", {**_job_attributes(jobs, shard), genai.SHARD_LINES:
                                                          len(part.lines)}):
                await jobs.create(part, data, name, metadata, save)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("native shard %s: creating an upstream batch failed: %s", shard.key,
                        escaped(describe_error(exc)))
            return f"creating the upstream batch failed: {describe_error(exc)}"
        part.created_at = time.time()  # how long a job takes tells whether a follow-up one has time
        await save()
        log.info("native shard %s: upstream batch %s (%d requests, %s)", shard.key, escaped(part.batch_id),
                 len(part.lines), jobs.provider)
        return None

    async def _find(self, jobs: UpstreamJobs, part: Part) -> bool:
        """A job created from the part's uploaded file before a crash could record its id (recent ones only)."""
        if await jobs.find(part):
            return True
        part.file_id = None
        return False

    # -- poll and read back ---------------------------------------------------------------------

    async def _poll(
        self, jobs: UpstreamJobs, shard: Shard, pending: list[Part], by_line: dict[int, BatchRequest],
        prices: Prices | None, save: Callable[[], Awaitable[None]],
    ) -> AsyncIterator[Result]:
        delay = self._poll_first
        errors: dict[str, int] = {}
        while pending:
            for part in list(pending):
                assert part.batch_id is not None
                try:
                    with tracing.client_span("batch_job.poll", {**_job_attributes(jobs, shard),
                                                                genai.UPSTREAM_BATCH_ID: part.batch_id}):
                        job = await jobs.retrieve(part.batch_id)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    errors[part.batch_id] = errors.get(part.batch_id, 0) + 1
                    if retryable(exc) and errors[part.batch_id] < _MAX_POLL_ERRORS:
                        log.warning("native shard %s: polling %s failed: %s", shard.key, escaped(part.batch_id),
                                    escaped(describe_error(exc)))
                        continue
                    job = JobState(status="failed", why=f"polling it failed: {describe_error(exc)}")
                else:
                    errors.pop(part.batch_id, None)
                    if job.status not in TERMINAL:
                        continue
                pending.remove(part)
                async for result in self._read_back(jobs, part, job, by_line, prices):
                    yield result
                settled_now(holder(shard, part.lines[0], part.rerun))  # its results replace its hold once recorded
                await save()
                await accumulate_route(self._store, shard)
            if pending:
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, self._poll_max)

    async def _read_back(
        self, jobs: UpstreamJobs, part: Part, job: JobState, by_line: dict[int, BatchRequest],
        prices: Prices | None,
    ) -> AsyncIterator[Result]:
        """Results of a finished upstream job: its result lines, then errors for what is missing."""
        part.status = job.status
        part.ended_at = time.time()
        status, why = job.status, job.why
        mine = set(part.lines)
        seen: set[int] = set()
        usage = Usage()
        try:
            download = {genai.PROVIDER_NAME: genai.provider_name(jobs.provider),
                        genai.UPSTREAM_BATCH_ID: part.batch_id or ""}
            with tracing.client_span("batch_job.download", download, current=False):
                async for obj in jobs.results(job):
                    line = line_of(obj.get("custom_id"))
                    if line is None or line not in mine or line in seen:
                        continue
                    seen.add(line)
                    req = by_line.get(line)
                    if req is None:  # recorded before a restart: only its tokens count
                        usage.add(line_usage(obj))
                        continue
                    result = result_from_line(obj, req)
                    if prices is not None and result.ok:  # the provider bills this line at its batch price
                        result.cost_usd = prices.cost(result.usage)
                    usage.add(result.usage)
                    yield with_priming(part, result)
        except Exception as exc:
            if retryable(exc):
                raise  # transient: the runner runs the shard again, which reads this job again
            why = f"reading its results failed: {describe_error(exc)}"
            status = "failed"
            log.warning("native: upstream batch %s: %s", escaped(part.batch_id), escaped(why))
        for line in part.lines:
            if line not in seen and line in by_line:
                yield with_priming(part, missing_result(by_line[line], status, part.batch_id or "?", why, job.code))
        part.input_tokens, part.output_tokens = usage.input_tokens, usage.output_tokens
        part.cost_usd = cost_of(usage, prices)
        if part.prime_cost_usd is not None:
            part.cost_usd = (part.cost_usd or 0.0) + part.prime_cost_usd

    # -- cancel -----------------------------------------------------------------------------------

    async def _cancel_if_stopped(self, jobs: UpstreamJobs, shard: Shard, parts: Sequence[Part]) -> None:
        """Cancel the running upstream jobs if our batch was cancelled or expired (not on shutdown)."""
        try:
            batch = await self._store.batches.get(shard.batch_id)
            if batch is None or stop_reason(batch) is None:
                return  # a shutdown: they keep running and are polled again after a restart
        except Exception as exc:
            log.warning("native shard %s: cannot tell why it stopped: %s", shard.key, escaped(describe_error(exc)))
            return
        for part in parts:
            if part.batch_id is None and part.file_id is not None:
                await jobs.find(part)  # cancelled while creating it: it may exist all the same
            if part.batch_id is None or part.status is not None:
                continue
            batch_id = part.batch_id
            try:
                await asyncio.wait_for(call_with_retries(functools.partial(jobs.cancel, batch_id)), _CANCEL_TIMEOUT)
                log.info("native shard %s: cancelled upstream batch %s", shard.key, escaped(batch_id))
            except Exception as exc:  # best effort: the upstream job ends by itself within its window
                log.warning("native shard %s: cancelling upstream batch %s failed: %s", shard.key, escaped(batch_id),
                            escaped(describe_error(exc)))


__all__ = ["NativeBatchBackend", "drop_native_state", "native_route_summary"]
