"""`LocalEngineBackend`: the in-process vLLM engine behind the `Backend` interface.

One `AsyncLLM` (vLLM's v1 engine; its engine core runs in one child process)
and vLLM's own OpenAI serving layer on top, built as `vllm run_batch` builds it
(see `local_engine.serving`), so response bodies are the ones `vllm serve`
returns. Unlike run_batch we also serve `/v1/completions`, never hold a whole
file, and keep at most `max_in_flight` requests in the engine at once, shared
by every concurrent `execute` call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gateway.backends.bounded import RequestSpans, run_bounded
from gateway.backends.interface import BackendUnavailable
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.lines.body_fields import unknown_field, unrecognized, unsupported
from gateway.lines.media_urls import refused_media
from gateway.log_safe import escaped
from gateway.scheduling.engine_priority import with_priority
from gateway.scheduling.fairness import FairSlots, current_share
from local_engine.ordering import group_by_prefix

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from local_engine.serving import ServingLayer

# INTERNAL spans: the engine runs in this process (gen_ai.provider.name "vllm")
_SPANS = RequestSpans(lambda _model: "vllm", internal=True)
log = logging.getLogger(__name__)

# vLLM's priority scheduling is our default: the fair-share rule then orders the engine's waiting queue too
# (`gateway.scheduling.engine_priority`). `scheduling_policy` in engine_args (or `--scheduling-policy`) still wins.
DEFAULT_SCHEDULING_POLICY = "priority"
# The endpoints whose vLLM request models have a `priority` field (the audio ones have none).
_PRIORITISED = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.EMBEDDINGS, Endpoint.SCORE, Endpoint.RERANK})


# vLLM request fields that change what the operator set for the engine (its chat template, multimodal
# processing, KV/EC transfer, custom logits processors' arguments, raw prompt embeddings, the engine's own
# request id): a line may carry one only where `model_info.allowed_params` lists it.
OPERATOR_FIELDS = frozenset({
    "chat_template", "mm_processor_kwargs", "media_io_kwargs", "mm_payload", "kv_transfer_params",
    "ec_transfer_params", "vllm_xargs", "logits_processors", "prompt_embeds", "request_id",
})


class EngineStartError(BackendUnavailable):
    """The engine could not be started (bad model path, bad engine_args, engine-core failure)."""


class LocalEngineBackend:
    """Executes requests on an in-process vLLM engine.

    `engine_args` are `vllm run_batch`'s options by python name, e.g.
    ``{"model": "/models/llama", "served_model_name": ["llama-3-8b"],
    "max_model_len": 8192, "dtype": "bfloat16", "enforce_eager": True}``;
    `model` is required. Requests whose `body["model"]` is not a served name
    get vLLM's 404.

    `max_in_flight` is the submission window: the requests inside the engine
    at once, running and waiting, shared by every concurrent `execute` call
    (default: twice the engine's `max_num_seqs`, so the scheduler always has
    a full batch waiting and vLLM's waiting queue never holds more than one
    batch more). The window is divided between teams by fair share
    (`FairSlots`), and inside the engine vLLM's priority scheduling (our
    default `scheduling_policy`) orders the waiting queue by the same rule: each
    request's `priority` comes from `gateway.scheduling.engine_priority` (its team's share
    in use, its batch's deadline, the line's own priority), so a newcomer's
    requests run before those another team has waiting. With
    ``scheduling_policy: fcfs`` in `engine_args` bodies go in unchanged.
    `endpoints` is known once `start()` has returned.

    `group_prefixes` (default on) sends a shard's lines that share a system
    prompt one after another, for vLLM's prefix cache (`local_engine.ordering`).
    """

    def __init__(
        self, engine_args: Mapping[str, Any], *, max_in_flight: int | None = None, group_prefixes: bool = True,
        allowed_params: frozenset[str] = frozenset(), allowed_media_domains: frozenset[str] = frozenset(),
    ) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.engine_args: dict[str, Any] = dict(engine_args)
        self.allowed_params = allowed_params  # the route's `model_info.allowed_params`
        self.allowed_media_domains = allowed_media_domains
        self._max_in_flight_arg = max_in_flight
        self.group_prefixes = group_prefixes
        self.max_in_flight = max_in_flight or 0
        self._engine: AsyncLLM | None = None
        self._serving: ServingLayer | None = None
        self._slots: FairSlots | None = None
        self._prioritise = False  # the engine schedules by priority: each request gets its fair-share number
        self._start_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------------------------

    @property
    def endpoints(self) -> frozenset[Endpoint]:  # type: ignore[override]
        return self._serving.endpoints if self._serving is not None else frozenset()

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return self._serving.served_model_names if self._serving is not None else ()

    @property
    def started(self) -> bool:
        return self._serving is not None

    async def start(self) -> None:
        """Build the engine and the serving layer once; later calls return at once."""
        async with self._start_lock:
            if self._closed:
                raise RuntimeError("LocalEngineBackend is closed")
            if self._serving is not None:
                return
            _check_model_path(self.engine_args.get("model"))
            from local_engine import serving

            engine_args = self.engine_args
            if not any(k.replace("-", "_") == "scheduling_policy" for k in engine_args):
                engine_args = {**engine_args, "scheduling_policy": DEFAULT_SCHEDULING_POLICY}
            try:
                args = serving.build_args(engine_args)
            except (ValueError, KeyError) as exc:
                raise EngineStartError(f"bad engine_args: {exc}") from exc
            engine = await _build_engine_off_loop(args, engine_args)
            try:
                layer = await serving.ServingLayer.create(engine, args)
                if self._closed:
                    raise RuntimeError("LocalEngineBackend was closed while starting")
            except BaseException:
                serving.shutdown_engine(engine)
                raise
            self._engine, self._serving = engine, layer
            self._prioritise = str(engine.vllm_config.scheduler_config.policy) == "priority"
            # vLLM keeps some import-time tracebacks that pin this frame: drop the engine from it so aclose() frees it.
            del engine, layer
            self.max_in_flight = self._max_in_flight_arg or max(1, 2 * self._serving.max_num_seqs)
            self._slots = FairSlots(self.max_in_flight)  # the engine's window, divided between teams
            log.info(
                "local engine ready: model=%s served=%s endpoints=%s max_in_flight=%d",
                args.model,
                ",".join(self._serving.served_model_names),
                ",".join(sorted(e.value for e in self._serving.endpoints)),
                self.max_in_flight,
            )

    async def aclose(self) -> None:
        """Abort what is in flight and stop the engine-core process. Idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        engine, self._engine, self._serving = self._engine, None, None
        if engine is not None:
            from local_engine.serving import shutdown_engine

            shutdown_engine(engine)  # synchronous, so a cancellation cannot cut it short
            del engine
            gc.collect()  # collect the engine's reference cycles now, not in a noisy __del__ at interpreter exit

    async def __aenter__(self) -> LocalEngineBackend:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- execution ------------------------------------------------------------------------------------------------

    async def execute(self, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]:
        """Yield one `Result` per request, as each finishes.

        Requests enter the engine as slots free up (grouped by system prompt
        when `group_prefixes`); closing the iterator early (or cancelling its
        consumer) aborts the ones still running.
        """
        if self._serving is None or self._slots is None:
            raise RuntimeError("LocalEngineBackend.start() has not been called (or it was closed)")
        serving, slots, share = self._serving, self._slots, current_share()
        prioritise = self._prioritise

        async def one(req: BatchRequest) -> Result:
            refused = await self._refusal(serving, req)
            if refused is not None:
                return refused
            body = req.body
            if prioritise and req.url in _PRIORITISED:
                body = with_priority(body, share, slots.in_use(share.team))
            return await _run_one(serving, req, body)

        # aclosing: closing this iterator must close the inner one now, not at garbage collection
        ordered = group_by_prefix(requests) if self.group_prefixes else requests
        async with contextlib.aclosing(run_bounded(ordered, one, slots, self._tasks, _SPANS)) as results:
            async for result in results:
                yield result


    async def _refusal(self, serving: ServingLayer, req: BatchRequest) -> Result | None:
        """A line's 400 for a field vLLM's request model does not have (vLLM would ignore it), for a field that
        overrides the operator's settings without `allowed_params`, or for a media URL we may not fetch."""
        known = serving.fields(req.url)
        if known:  # an endpoint the engine does not serve is answered by the serving layer in its own words
            name = unknown_field(req.body, known | self.allowed_params)
            if name is not None:
                return unrecognized(req, name)
            name = next((f for f in req.body if f in OPERATOR_FIELDS and f not in self.allowed_params), None)
            if name is not None:
                return unsupported(req, name, "it overrides the operator's engine settings; the config can allow "
                                   "it in model_info.allowed_params")
        return await refused_media(req, req.body, self.allowed_media_domains)


async def _run_one(serving: ServingLayer, req: BatchRequest, body: dict[str, Any]) -> Result:
    from vllm.utils import random_uuid

    try:
        status, body = await serving.reply(req.url, body)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # reply() catches everything it can; this is a last guard
        log.exception("local engine: request %s failed", escaped(req.custom_id))
        from local_engine.serving import error_reply

        status, body = error_reply(exc)
    return Result(
        line=req.line,
        custom_id=req.custom_id,
        status_code=status,
        body=body,
        request_id=f"vllm-batch-{random_uuid()}",
        model=req.model,
    )


def _check_model_path(model: Any) -> None:
    """Fail fast on a local path that is not there (vLLM would otherwise try the Hub)."""
    if not model:
        raise EngineStartError("engine_args needs a 'model'")
    text = str(model)
    looks_local = isinstance(model, Path) or text.startswith(("/", "./", "../", "~", os.sep))
    if looks_local and not Path(text).expanduser().is_dir():
        raise EngineStartError(f"model path {text!r} does not exist or is not a directory")


_LOADING: set[threading.Thread] = set()  # engine builds still running in their threads


def exit_while_loading(code: int) -> None:
    """End the process now if an engine is still being built in its thread; else return.

    The interpreter's own exit would finalize while that thread is deep in vLLM and torch: a daemon thread
    stopped there aborts the process (`FATAL: exception not rethrown`, status 134) or deadlocks it (a run
    that reported its invalid input hung for good). So: stop our child processes (an engine-core process
    already spawned handles SIGTERM), flush, and `os._exit` with the command's status. The caller has closed
    the store and written its output and its report before this."""
    if not any(t.is_alive() for t in _LOADING):
        return
    import multiprocessing
    import sys

    for child in multiprocessing.active_children():
        child.terminate()
        child.join(5)
        if child.is_alive():
            child.kill()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


async def _build_engine_off_loop(args: Any, chosen: Mapping[str, Any]) -> AsyncLLM:
    """Build the engine in a worker thread so the event loop keeps serving while it loads.

    If the caller is cancelled (Ctrl-C) meanwhile, the engine is shut down as
    soon as its construction finishes, so no engine-core process is left behind.
    """
    from local_engine.serving import build_engine, shutdown_engine

    future: concurrent.futures.Future[AsyncLLM] = concurrent.futures.Future()

    def build() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(build_engine(args, list(chosen)))
            except BaseException as exc:
                future.set_exception(exc)

    # A daemon thread, not an executor's: a run that fails on its input while the engine loads exits at
    # once (the interpreter joins executor threads at exit, which would wait out the whole load). Such an
    # exit must not finalize the interpreter under it: see `exit_while_loading`.
    thread = threading.Thread(target=build, name="local-engine-start", daemon=True)
    _LOADING.add(thread)
    future.add_done_callback(lambda _f: _LOADING.discard(thread))
    thread.start()
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:

        def _discard(fut: concurrent.futures.Future[AsyncLLM]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                with contextlib.suppress(Exception):
                    shutdown_engine(fut.result())

        future.add_done_callback(_discard)
        raise
    except Exception as exc:
        raise EngineStartError(f"vLLM engine failed to start for model {args.model!r}: {exc}") from exc
