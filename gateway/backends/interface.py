"""The `Backend` interface: how a shard's requests get executed.

`providers.litellm_backend` (upstream, through LiteLLM's Router),
`providers.native` (upstream batch jobs) and `local_engine.backend`
(in-process vLLM) each provide one. The runtime knows nothing else about
them: what is special to one backend hangs on the optional hooks below.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, Protocol, cast, runtime_checkable

from gateway.metrics import RequestMeter
from gateway.records import BatchRequest, Endpoint, Result, Shard
from gateway.scheduling.fairness import FairSlots, current_share
from gateway.scheduling.pacing import current_pacer


@runtime_checkable
class Backend(Protocol):
    """Executes requests for one route and yields results as they finish.

    Contract:
    - `execute` yields exactly one `Result` per request given, in any order,
      as each finishes; it never raises for a single request's failure (a
      provider error becomes that request's `Result` with the provider's
      status code and error body).
    - It bounds its own concurrency; the pipeline may call `execute` for
      several shards at once and expects them to share that bound.
    - `start` is idempotent and may be slow (loading an engine); `aclose`
      releases everything (processes, sockets) and is idempotent too.
    """

    @property
    def endpoints(self) -> frozenset[Endpoint]:
        """The endpoints this backend serves."""

    async def start(self) -> None: ...

    def execute(self, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ShardAwareBackend(Backend, Protocol):
    """A backend whose work outlives a process (upstream batch jobs): it is told
    which shard it runs, so it can find the jobs it created before a restart."""

    def execute_shard(self, shard: Shard, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]: ...


@runtime_checkable
class RouteReporter(Protocol):
    """A backend with facts of its own about a batch's route (upstream batch ids, batch-rate cost),
    and state to forget once the batch is finished. The finalizer calls both."""

    async def route_summary(self, batch_id: str, route: str) -> dict[str, Any]: ...

    async def forget_batch(self, batch_id: str) -> None: ...


class Backends(Protocol):
    """Where the runner gets a route's started backend (`gateway.runtime.pool.BackendPool`, which the
    composition root builds: it knows the implementations, the pipeline does not)."""

    async def get(self, route_name: str) -> Backend: ...


class BackendUnavailable(RuntimeError):
    """A backend that cannot start for a reason that starting again will not mend (a local model's path that
    does not exist, engine_args vLLM refuses, an engine core that dies while loading). Its route stops alone:
    the pool remembers it, the runner answers that route's lines with `ROUTE_UNAVAILABLE` and the reason, and
    every other route runs on."""


# The error code of a line whose route's backend could not start
ROUTE_UNAVAILABLE = "model_unavailable"


_WAKE = object()  # put on a run's queue to have it look at its state again


async def run_bounded(
    requests: Sequence[BatchRequest],
    call: Callable[[BatchRequest], Coroutine[Any, Any, Result]],
    slots: FairSlots,
    tracked: set[asyncio.Task[Any]] | None = None,
) -> AsyncGenerator[Result, None]:
    """`call` on every request, at most `slots` at once, yielding results as they finish.

    `slots` is the backend's, shared by every shard in flight: one bound per
    backend, whose free slots go to the teams by fair share (`gateway.scheduling.fairness`):
    the requests are the share's the caller runs for (`running_for`). Closing
    the iterator early (or cancelling its consumer) cancels the calls still
    running. Under a team's rate limits (`pacing_with`, `gateway.scheduling.pacing`)
    the requests reach the slots only as the store's rate window grants them:
    one waiting for the next window holds no slot. `call` turns a request's failure into its `Result`; a call that
    raises or is cancelled from outside (the backend closing: its tasks are in
    `tracked`) ends the iteration with an error.
    """
    share = current_share()
    pacer = current_pacer()
    done: asyncio.Queue[Result | BaseException | object] = asyncio.Queue()
    mine: set[asyncio.Task[Any]] = set()

    def forget(task: asyncio.Task[Any]) -> None:
        mine.discard(task)
        if tracked is not None:
            tracked.discard(task)

    def finished(task: asyncio.Task[Result]) -> None:
        forget(task)
        if task.cancelled():
            done.put_nowait(RuntimeError("the backend was closed while executing"))
        elif (exc := task.exception()) is not None:
            done.put_nowait(exc)
        else:
            if pacer is not None:
                pacer.note(task.result())
            done.put_nowait(task.result())
        slots.release(share)  # in a callback: it runs even for a task cancelled before it started

    meters: dict[str, RequestMeter] = {}  # by route (the line's model): one or a few per call

    async def measured(req: BatchRequest) -> Result:
        # Every backend's per-request call passes here: in-flight and latency per route.
        meter = meters.get(req.model)
        if meter is None:
            meter = meters[req.model] = RequestMeter(req.model, share.team)
        started = time.monotonic()
        with meter.in_flight():
            result = await call(req)
        meter.observe_latency(time.monotonic() - started)
        return result

    queue = iter(requests)
    started = granted = 0
    stopped = False
    caught_up = asyncio.Event()  # every request granted so far has started (the pacer may ask for more)

    def start() -> None:  # the slots call it when this flow's next request may start
        nonlocal started
        started += 1
        task = asyncio.create_task(measured(next(queue)))
        mine.add(task)
        if tracked is not None:
            tracked.add(task)
        task.add_done_callback(finished)
        if started >= granted:
            caught_up.set()

    def stop() -> None:  # `stop_sending` (a budget spent): what is in flight finishes, nothing more starts
        nonlocal stopped
        stopped = True
        done.put_nowait(_WAKE)

    feeding: asyncio.Task[None] | None = None
    if pacer is None:
        flow = slots.open(share, len(requests), start, stop)
    else:
        flow = slots.open(share, 0, start, stop)

        def grant(n: int) -> None:
            nonlocal granted
            granted += n
            slots.add(flow, n)

        feeding = asyncio.create_task(pacer.feed(requests, grant, caught_up))
        feeding.add_done_callback(lambda t: None if t.cancelled() or t.exception() is None
                                  else done.put_nowait(t.exception()))
    try:
        received = 0
        while received < len(requests) and not (stopped and received >= started):
            item = await done.get()
            if item is _WAKE:
                continue
            if isinstance(item, BaseException):
                raise item
            received += 1
            yield cast(Result, item)
    finally:
        slots.close(flow)  # first: no call starts after the ones cancelled here
        pending = list(mine)
        if feeding is not None:
            feeding.cancel()
            pending.append(feeding)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
