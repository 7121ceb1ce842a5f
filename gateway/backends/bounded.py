"""One shard's requests through a backend's request slots: `BoundedRun` (and `run_bounded`, its one call).

Every backend that calls once per request (the LiteLLM backend, the local engine) runs a shard's requests
here, so each keeps one bound on its requests in flight, shared by every shard it runs:

- the free slots go to the teams by fair share (`gateway.scheduling.fairness.FairSlots`): the requests are
  those of the share the caller runs for (`running_for`);
- under a team's rate limits (`pacing_with`, `gateway.scheduling.pacing`) requests reach the slots only as
  the store's rate window grants them: one waiting for the next window holds no slot;
- results are yielded as they finish; closing the iterator early (or cancelling its consumer) cancels the
  calls still running, and a budget's `stop_sending` lets the ones in flight finish and starts no more;
- a team with a budget has each request granted against it as it starts (`gateway.lines.budget`: the spend in
  the store and this process's results not yet journaled): once it is spent, the request gets
  `budget_exceeded` and nothing more starts. A result is priced and counted as spent before its slot is
  released (`TeamSpending.finished`), so the request that slot starts next sees it: spend passes the budget
  by at most the requests in flight when it was reached.

The slots call back into the run (`_start`, `_stop`) from whichever task frees a slot; the run's own
iterator only waits on its queue of finished calls (`_done`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from gateway import tracing
from gateway.domain import BatchRequest, Result
from gateway.lines.budget import current_spending
from gateway.lines.stops import OVER_BUDGET
from gateway.metrics import RequestMeter
from gateway.scheduling.fairness import FairSlots, Flow, current_share
from gateway.scheduling.pacing import current_pacer

Call = Callable[[BatchRequest], Coroutine[Any, Any, Result]]

_WAKE = object()  # put on a run's queue to have it look at its state again


class BoundedRun:
    """`call` on every request, at most the slots' limit at once (with every other run on them).

    The share and the pacer are those of the caller's context when the run is made. `call` turns a
    request's failure into its `Result`; a call that raises, or is cancelled from outside (the backend
    closing: its tasks are in `tracked`), ends the iteration with an error.
    """

    def __init__(self, requests: Sequence[BatchRequest], call: Call, slots: FairSlots,
                 tracked: set[asyncio.Task[Any]] | None = None, spans: RequestSpans | None = None) -> None:
        self.total = len(requests)
        self._requests: Iterator[BatchRequest] = iter(requests)
        self._all = requests  # the pacer reads them (their sizes) to estimate tokens
        self._call, self._slots, self._tracked = call, slots, tracked
        self.share, self.pacer = current_share(), current_pacer()
        spending = current_spending()
        self._spending = spending if spending is not None and spending.budgeted else None
        # each request's span (gateway.tracing): a child of the caller's (the shard's) span, made here for the same
        # reason as the share: the calls start from whichever task frees a slot
        self._trace = tracing.capture(spans.provider, internal=spans.internal) if spans is not None else None
        self.started = 0  # calls started (each holds a slot until it finishes)
        self.granted = 0  # requests the pacer let through so far (unpaced: not counted)
        self.stopped = False  # `stop_sending`: nothing more starts
        self._done: asyncio.Queue[Result | BaseException | object] = asyncio.Queue()
        self._mine: set[asyncio.Task[Any]] = set()
        self._meters: dict[str, RequestMeter] = {}  # by route (the line's model): one or a few per run
        self._caught_up = asyncio.Event()  # every request granted so far has started (the pacer may ask for more)
        self._flow: Flow | None = None
        self._feeding: asyncio.Task[None] | None = None

    async def results(self) -> AsyncGenerator[Result, None]:
        """The results as they finish; closing this iterator cancels what still runs."""
        self._open()
        try:
            received = 0
            while received < self.total and not (self.stopped and received >= self.started):
                item = await self._done.get()
                if item is _WAKE:
                    continue
                if isinstance(item, BaseException):
                    raise item
                received += 1
                yield cast(Result, item)
        finally:
            await self._close()

    def _open(self) -> None:
        if self.pacer is None:
            self._flow = self._slots.open(self.share, self.total, self._start, self._stop)
            return
        self._flow = self._slots.open(self.share, 0, self._start, self._stop)
        self._feeding = asyncio.create_task(self.pacer.feed(self._all, self._grant, self._caught_up))
        self._feeding.add_done_callback(self._fed)

    async def _close(self) -> None:
        assert self._flow is not None
        self._slots.close(self._flow)  # first: no call starts after the ones cancelled here
        pending = list(self._mine)
        if self._feeding is not None:
            self._feeding.cancel()
            pending.append(self._feeding)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # -- called back by the slots and the pacer -------------------------------------------------------

    def _start(self) -> None:
        """The slots say this run's next request may start (a slot is taken for it)."""
        self.started += 1
        task = asyncio.create_task(self._measured(next(self._requests)))
        self._mine.add(task)
        if self._tracked is not None:
            self._tracked.add(task)
        task.add_done_callback(self._finished)
        if self.started >= self.granted:
            self._caught_up.set()

    def _stop(self) -> None:
        """`stop_sending` (a budget spent): what is in flight finishes, nothing more starts."""
        self.stopped = True
        self._done.put_nowait(_WAKE)

    def _grant(self, n: int) -> None:
        """The pacer lets `n` more requests reach the slots."""
        self.granted += n
        assert self._flow is not None
        self._slots.add(self._flow, n)

    def _fed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._done.put_nowait(task.exception())

    def _finished(self, task: asyncio.Task[Result]) -> None:
        self._mine.discard(task)
        if self._tracked is not None:
            self._tracked.discard(task)
        if task.cancelled():
            self._done.put_nowait(RuntimeError("the backend was closed while executing"))
        elif (exc := task.exception()) is not None:
            self._done.put_nowait(exc)
        else:
            if self.pacer is not None:
                self.pacer.note(task.result())
            if self._spending is not None:
                self._spending.finished(task.result())  # spent before the slot can start another request
            self._done.put_nowait(task.result())
        self._slots.release(self.share)  # in a callback: it runs even for a task cancelled before it started

    async def _measured(self, req: BatchRequest) -> Result:
        if self._spending is not None and await self._spending.over():  # granted against the budget, or none
            if not self.stopped:
                self._stop()
            return Result.failure(req.line, req.custom_id, *OVER_BUDGET, model=req.model)
        # Every backend's per-request call passes here: in-flight and latency per route.
        meter = self._meters.get(req.model)
        if meter is None:
            meter = self._meters[req.model] = RequestMeter(req.model, self.share.team)
        began = time.monotonic()
        with meter.in_flight():
            result = await (self._call(req) if self._trace is None else tracing.traced(self._trace, req, self._call))
        meter.observe_latency(time.monotonic() - began)
        return result


@dataclass(frozen=True, slots=True)
class RequestSpans:
    """How a backend's requests are traced: `provider` names a request's model's gen_ai.provider.name;
    `internal`: the in-process engine (INTERNAL spans), not an upstream (CLIENT)."""

    provider: Callable[[str], str]
    internal: bool = False


def run_bounded(requests: Sequence[BatchRequest], call: Call, slots: FairSlots,
                tracked: set[asyncio.Task[Any]] | None = None,
                spans: RequestSpans | None = None) -> AsyncGenerator[Result, None]:
    """`BoundedRun(...).results()`: `call` on every request through `slots`, results as they finish."""
    return BoundedRun(requests, call, slots, tracked, spans).results()


__all__ = ["BoundedRun", "Call", "RequestSpans", "run_bounded"]
