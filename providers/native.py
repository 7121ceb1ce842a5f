"""Upstream-native batches: a route's shards forwarded as provider batch jobs, at batch prices.

A deployment marked `model_info: {batch_mode: native}` gets no call per line.
Each shard is rewritten for the provider (its url form, the deployment's model,
custom_id `l<line>`), split under the upstream file limits, uploaded with
`litellm.acreate_file` and run with `litellm.acreate_batch`; the file and batch
ids are recorded in the store's meta (`native:<batch>:<shard>`) before any
polling, so a restarted process polls the batches it already created instead of
creating new ones. `aretrieve_batch` polls with backoff; `afile_content` reads
the output and error files back; every request gets exactly one `Result`.
When the shard runner cancels a shard because our batch was cancelled or expired,
the upstream batches are cancelled too (`acancel_batch`); a process shutdown
leaves them running, to be picked up on restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from gateway.config.routes import Route
from gateway.pipeline.lifecycle import stop_reason
from gateway.records import BatchRequest, Result, Shard, Usage, new_id
from gateway.store.base import Store
from providers.openai_batches import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_LINES,
    NATIVE_ENDPOINTS,
    PROVIDERS,
    TERMINAL,
    Part,
    accumulate_route,
    batch_error_message,
    batch_prices,
    call_with_retries,
    cost_of,
    describe_error,
    detached,
    drop_native_state,
    line_of,
    line_usage,
    missing_result,
    native_route_summary,
    plan_parts,
    result_from_line,
    retryable,
    shard_meta_key,
    upstream_file_lines,
    upstream_line,
)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

log = logging.getLogger("batchyard.native")

_MAX_POLL_ERRORS = 10  # consecutive transient polling errors before a part's requests get error results
_CANCEL_TIMEOUT = 15.0
# LiteLLM's success logging of a terminal `aretrieve_batch` downloads the whole output file again to price it;
# its proxy's batch poller turns that off with this flag, and so do we (we read the file once, streamed).
_QUIET_POLL = {"batch_ignore_default_logging": True}


class NativeBatchBackend:
    """Runs one native route's shards as upstream batch jobs (`ShardAwareBackend`)."""

    endpoints = NATIVE_ENDPOINTS

    def __init__(self, route: Route, router_settings: dict[str, Any], store: Store) -> None:
        self.route = route
        self._store = store
        info = route.model_info
        self._max_lines = int(info.get("native_max_lines", DEFAULT_MAX_LINES))
        self._max_bytes = int(info.get("native_max_bytes", DEFAULT_MAX_BYTES))
        self._poll_max = float(info.get("native_poll_max_seconds", 60.0))
        self._poll_first = min(float(info.get("native_poll_initial_seconds", 0.5)), self._poll_max)
        self._timeout = router_settings.get("timeout")
        self._litellm: Any = None

    async def start(self) -> None:
        if self._litellm is None:
            import litellm

            litellm.suppress_debug_info = True
            self._litellm = litellm

    async def aclose(self) -> None:
        return None

    # -- the deployment -------------------------------------------------------------------------

    def _deployment(self, index: int) -> tuple[str, str, dict[str, Any], tuple[float, float] | None]:
        """(provider, upstream model, LiteLLM call kwargs, batch prices) of deployment `index`."""
        entry = self.route.deployments[index % len(self.route.deployments)]
        params = entry["litellm_params"]
        provider, _, model = str(params["model"]).partition("/")
        kwargs: dict[str, Any] = {"custom_llm_provider": provider}
        for name in ("api_base", "api_key", "api_version", "organization", "timeout"):
            if params.get(name) is not None:
                kwargs[name] = params[name]
        if "timeout" not in kwargs and self._timeout is not None:
            kwargs["timeout"] = self._timeout
        info = dict(entry.get("model_info") or {})
        candidates = [info.get("base_model") or "", str(params["model"]), model]
        return provider, model, kwargs, batch_prices(info, self._litellm.model_cost, candidates)

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
        await self._store.delete_meta(shard_meta_key(shard))

    async def execute_shard(self, shard: Shard, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]:
        await self.start()
        by_line = {r.line: r for r in requests}
        key = shard_meta_key(shard)
        state = await self._store.get_meta(key) or {"deployment": shard.index % len(self.route.deployments)}
        provider, model, kwargs, prices = self._deployment(int(state["deployment"]))
        if provider not in PROVIDERS:
            message = f"native batches need an openai/ or azure/ deployment, not {provider}/"
            for req in requests:
                yield Result.failure(req.line, req.custom_id, "native_unsupported", message, model=req.model)
            return
        unsupported = [r for r in requests if r.url not in NATIVE_ENDPOINTS]
        for req in unsupported:
            yield Result.http_error(req.line, req.custom_id, 400, f"{req.url.value} is not supported in upstream "
                                    "batches", type_="invalid_request_error", code="unsupported_endpoint",
                                    model=req.model)
        parts = [Part.from_json(p) for p in state.get("parts", [])]
        parts = [p for p in parts if p.batch_id or (p.file_id and await self._find_batch(p, kwargs))]
        covered = {line for p in parts for line in p.lines}
        fresh = [r for r in requests if r.line not in covered and r.url in NATIVE_ENDPOINTS]
        new_parts, too_big = plan_parts(fresh, provider, self._max_lines, self._max_bytes)
        for req in too_big:
            yield Result.failure(req.line, req.custom_id, "request_too_large",
                                 f"the request is larger than the upstream file limit of {self._max_bytes} bytes",
                                 model=req.model)
        parts += new_parts

        async def save() -> None:
            await self._store.put_meta(key, {"deployment": state["deployment"], "parts": [p.to_json() for p in parts]})

        pending: list[Part] = []  # created, not yet finished
        try:
            for i, part in enumerate(parts):
                if not any(line in by_line for line in part.lines):
                    continue  # every request of it is recorded already
                if part.batch_id is None:
                    failure = await self._create(shard, i, part, by_line, provider, model, kwargs, save)
                    if failure is not None:
                        for line in part.lines:
                            if line in by_line:
                                req = by_line[line]
                                yield Result.failure(line, req.custom_id, "upstream_batch_failed", failure,
                                                     model=req.model)
                        continue
                pending.append(part)
            async for result in self._poll(shard, pending, by_line, kwargs, prices, save):
                yield result
        except (asyncio.CancelledError, GeneratorExit):
            # Cancelled while waiting (the shard runner cancels the consuming task), or closed while suspended.
            await asyncio.shield(self._cancel_if_stopped(shard, parts, kwargs))
            raise

    # -- create ------------------------------------------------------------------------------

    async def _create(
        self, shard: Shard, index: int, part: Part, by_line: dict[int, BatchRequest], provider: str, model: str,
        kwargs: dict[str, Any], save: Callable[[], Awaitable[None]],
    ) -> str | None:
        """Upload the part's file and create its batch, recording each id as soon as it exists.

        Returns None on success, else the reason (the part's requests get error results)."""
        litellm = self._litellm
        part.lines = [line for line in part.lines if line in by_line]  # never resend a recorded request
        data = b"".join(upstream_line(by_line[line], provider, model) for line in part.lines)
        name = f"batchyard-{shard.batch_id}-{shard.index}-{index}.jsonl"
        try:
            if part.file_id is None:
                upload = await call_with_retries(
                    lambda: litellm.acreate_file(file=(name, data), purpose="batch", **kwargs))
                part.file_id = str(upload.id)
                await save()
            file_id = part.file_id
            metadata = {"batchyard_shard": shard.key, "batchyard_part": str(index)}
            batch = await call_with_retries(lambda: litellm.acreate_batch(
                completion_window="24h", endpoint=part.endpoint, input_file_id=file_id, metadata=metadata, **kwargs))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("native shard %s: creating an upstream batch failed: %s", shard.key, describe_error(exc))
            return f"creating the upstream batch failed: {describe_error(exc)}"
        part.batch_id = str(batch.id)
        await save()
        log.info("native shard %s: upstream batch %s (%d requests, %s)", shard.key, part.batch_id, len(part.lines),
                 kwargs["custom_llm_provider"])
        return None

    async def _find_batch(self, part: Part, kwargs: dict[str, Any]) -> bool:
        """A batch created from the part's file before a crash could record its id (recent ones only)."""
        with contextlib.suppress(Exception):
            page = await self._litellm.alist_batches(limit=100, **kwargs)
            for batch in getattr(page, "data", None) or []:
                if getattr(batch, "input_file_id", None) == part.file_id:
                    part.batch_id = str(batch.id)
                    return True
        part.file_id = None
        return False

    # -- poll and read back ---------------------------------------------------------------------

    async def _poll(
        self, shard: Shard, pending: list[Part], by_line: dict[int, BatchRequest], kwargs: dict[str, Any],
        prices: tuple[float, float] | None, save: Callable[[], Awaitable[None]],
    ) -> AsyncIterator[Result]:
        delay = self._poll_first
        errors: dict[str, int] = {}
        while pending:
            for part in list(pending):
                assert part.batch_id is not None
                try:
                    batch = await detached(self._litellm.aretrieve_batch(
                        batch_id=part.batch_id, litellm_metadata=_QUIET_POLL, **kwargs))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    errors[part.batch_id] = errors.get(part.batch_id, 0) + 1
                    if retryable(exc) and errors[part.batch_id] < _MAX_POLL_ERRORS:
                        log.warning("native shard %s: polling %s failed: %s", shard.key, part.batch_id,
                                    describe_error(exc))
                        continue
                    batch, why = None, f"polling it failed: {describe_error(exc)}"
                else:
                    errors.pop(part.batch_id, None)
                    if str(batch.status) not in TERMINAL:
                        continue
                    why = batch_error_message(batch) if batch.status == "failed" else ""
                pending.remove(part)
                async for result in self._read_back(part, batch, why, by_line, kwargs, prices):
                    yield result
                await save()
                await accumulate_route(self._store, shard)
            if pending:
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, self._poll_max)

    async def _read_back(
        self, part: Part, batch: Any, why: str, by_line: dict[int, BatchRequest], kwargs: dict[str, Any],
        prices: tuple[float, float] | None,
    ) -> AsyncIterator[Result]:
        """Results of a finished upstream batch: its output and error lines, then errors for what is missing."""
        status = str(batch.status) if batch is not None else "failed"
        part.status = status
        mine = set(part.lines)
        seen: set[int] = set()
        usage = Usage()
        file_ids = [getattr(batch, "output_file_id", None), getattr(batch, "error_file_id", None)] if batch else []
        for file_id in file_ids:
            if not file_id:
                continue
            try:
                async for raw in upstream_file_lines(self._litellm, str(file_id), kwargs):
                    try:
                        obj = json.loads(raw)
                    except ValueError:
                        log.warning("native: upstream batch %s: a result line is not JSON", part.batch_id)
                        continue
                    line = line_of(obj.get("custom_id"))
                    if line is None or line not in mine or line in seen:
                        continue
                    seen.add(line)
                    req = by_line.get(line)
                    if req is None:  # recorded before a restart: only its tokens count
                        usage.add(line_usage(obj))
                        continue
                    result = result_from_line(obj, req)
                    usage.add(result.usage)
                    yield result
            except Exception as exc:
                if retryable(exc):
                    raise  # transient: the runner runs the shard again, which reads this batch again
                why = f"reading its results ({file_id}) failed: {describe_error(exc)}"
                status = "failed"
                log.warning("native: upstream batch %s: %s", part.batch_id, why)
        for line in part.lines:
            if line not in seen and line in by_line:
                yield missing_result(by_line[line], status, part.batch_id or "?", why)
        part.input_tokens, part.output_tokens = usage.input_tokens, usage.output_tokens
        part.cost_usd = cost_of(usage, prices)

    # -- cancel -----------------------------------------------------------------------------------

    async def _cancel_if_stopped(self, shard: Shard, parts: Sequence[Part], kwargs: dict[str, Any]) -> None:
        """Cancel the running upstream batches if our batch was cancelled or expired (not on shutdown)."""
        try:
            batch = await self._store.get_batch(shard.batch_id)
            if batch is None or stop_reason(batch) is None:
                return  # a shutdown: they keep running and are polled again after a restart
        except Exception as exc:
            log.warning("native shard %s: cannot tell why it stopped: %s", shard.key, describe_error(exc))
            return
        for part in parts:
            if part.batch_id is None and part.file_id is not None:
                await self._find_batch(part, kwargs)  # cancelled while creating it: it may exist all the same
            if part.batch_id is None or part.status is not None:
                continue
            batch_id = part.batch_id
            try:
                await asyncio.wait_for(
                    call_with_retries(functools.partial(self._litellm.acancel_batch, batch_id=batch_id, **kwargs)),
                    _CANCEL_TIMEOUT)
                log.info("native shard %s: cancelled upstream batch %s", shard.key, batch_id)
            except Exception as exc:  # best effort: the upstream batch ends by itself within its window
                log.warning("native shard %s: cancelling upstream batch %s failed: %s", shard.key, batch_id,
                            describe_error(exc))


__all__ = ["NativeBatchBackend", "drop_native_state", "native_route_summary"]
