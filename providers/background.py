"""A `batch_mode: background` route: its lines fill what a shared vLLM server's live traffic leaves idle.

- Each line goes out with the request field `priority` (the route's `background_priority`; vLLM serves lower
  first, live traffic sends 0). A server not run with `--scheduling-policy priority` may refuse a non-zero
  priority with a 400 (vLLM's own check: "Got priority 10 but Priority scheduling is not enabled."): that is
  said once, in the log and on `/health`, and the route goes on without the field, paced all the same.
- Its requests run through slots of their own (`FairSlots`), whose bound follows the server's load: every
  `STEP_SECONDS` the server's `/metrics` is read and the allowed concurrency stepped by AIMD
  (`gateway.scheduling.busy_server`), within `max_parallel_requests`. The allowed concurrency is the
  deployment's, shared by its workers through the store; this worker's slots hold its part.
- A `/metrics` that cannot be read (down, not vLLM's, not this model's) sets the allowed concurrency to
  `FALLBACK_CONCURRENCY`, with a warning and `batchyard_background_metrics_up` at 0, until it can be again.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

import aiohttp

from gateway import metrics, tracing
from gateway.config.routes import BackgroundServer
from gateway.domain import Result
from gateway.scheduling.busy_server import (
    FALLBACK_CONCURRENCY,
    STEP_SECONDS,
    Aimd,
    ConcurrencyShares,
    ServerLoad,
    ShareAsk,
    ShareState,
    read_load,
)
from gateway.scheduling.fairness import FairSlots

log = logging.getLogger("batchyard.providers")

METRICS_TIMEOUT_SECONDS = 2.0
MAX_METRICS_BYTES = 16 * 1024 * 1024  # a vLLM scrape is tens of kilobytes


def priority_refused(result: Result) -> str | None:
    """The server's words when it refused the field `priority` (vLLM without `--scheduling-policy priority`:
    "Got priority N but Priority scheduling is not enabled."); None for any other answer."""
    if result.status_code != 400 or not isinstance(result.body, dict):
        return None
    error = result.body.get("error")
    message = error.get("message") if isinstance(error, dict) else result.body.get("message")
    if not isinstance(message, str):
        return None
    lowered = message.lower()
    if "priority" in lowered and ("scheduling is not enabled" in lowered or "not support priority" in lowered):
        return message
    return None


class BackgroundRoute:
    """One background route's pacing in this process (see the module docs)."""

    def __init__(self, route: str, server: BackgroundServer, ceiling: int, shares: ConcurrencyShares, worker: str,
                 controller: Aimd | None = None, step_seconds: float = STEP_SECONDS) -> None:
        self.route, self.server, self.worker = route, server, worker
        self.ceiling = max(1, ceiling)
        self.slots = FairSlots(0)  # bounded by this worker's part, set at each step
        self._shares, self._aimd, self._every = shares, controller or Aimd(), step_seconds
        self.allowed = min(FALLBACK_CONCURRENCY, self.ceiling)
        self.load: ServerLoad | None = None
        self.metrics_up: bool | None = None  # None: not read yet
        self.priority = True  # the field goes out until the server refuses it
        self.notice: str | None = None  # what the operator should know (/health, the dashboard)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    def body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A line's body as it goes out: with `priority`, unless the server refused it."""
        return {**body, "priority": self.server.priority} if self.priority else body

    def refused(self, message: str) -> None:
        """The server refused `priority`: said once, and the route goes on without it."""
        if not self.priority:
            return
        self.priority = False
        self.notice = (f"the server refused priority {self.server.priority} ({message!r}): run vLLM with "
                       "--scheduling-policy priority; lines go without it, paced by its load")
        log.warning("background route %s: %s", self.route, self.notice)

    def start(self) -> None:
        if self._task is None:
            # its own context: the loop outlives the shard that started it, and belongs to no batch's trace
            self._task = contextvars.Context().run(asyncio.get_running_loop().create_task, self._run())

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def state(self) -> dict[str, Any]:
        """What /health and the dashboard show of the route here."""
        return {"allowed": self.allowed, "in_flight": self.slots.used, "server_waiting": getattr(self.load, "waiting",
                None), "server_running": getattr(self.load, "running", None), "metrics_up": self.metrics_up,
                "priority": self.server.priority if self.priority else None, "notice": self.notice}

    async def _run(self) -> None:
        while True:
            began = time.monotonic()
            try:
                await self.step()
            except Exception:  # the store out of reach: keep the part held, try again next step
                log.exception("background route %s: pacing step failed", self.route)
            await asyncio.sleep(max(0.0, self._every - (time.monotonic() - began)))

    async def step(self) -> ShareState:
        """Read the server's load, take this worker's turn at the shared concurrency, step it when due."""
        load = await self._read()
        want, held = self.slots.used + self.slots.waiting, self.slots.used
        floor = min(FALLBACK_CONCURRENCY, self.ceiling)
        ask = ShareAsk(self.route, self.worker, want, held, time.time(), initial=floor)
        state = await self._shares.share_concurrency(ask)
        if ask.now - state.stepped_at >= self._every * 0.8:
            target = (self._aimd.step(state.allowed, load, state.reserved, self.ceiling, self.priority)
                      if load is not None
                      else floor)
            if target != state.allowed:
                ask = ShareAsk(self.route, self.worker, want, held, ask.now, ask.initial, (state.version, target))
                state = await self._shares.share_concurrency(ask)
        before, self.allowed = self.allowed, state.allowed
        self.slots.resize(state.grant)
        metrics.set_pacing(self.route, allowed=state.allowed, in_flight=self.slots.used,
                           waiting=load.waiting if load is not None else None, metrics_up=load is not None)
        if before != state.allowed:
            attrs: dict[str, bool | int] = {"batchyard.background.metrics_up": load is not None}
            if load is not None:
                attrs.update({"batchyard.background.server_waiting": load.waiting,
                              "batchyard.background.server_running": load.running})
            tracing.pacing_event(self.route, before, state.allowed, attrs)
        return state

    async def _read(self) -> ServerLoad | None:
        """The server's load now; None (and a warning when it changes) when /metrics cannot be read."""
        why = None
        load: ServerLoad | None = None
        try:
            load = read_load(await self._scrape(), self.server.served_model)
            if load is None:
                why = f"it holds no vllm:num_requests_* for model_name {self.server.served_model!r}"
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            if self.metrics_up is not False:
                log.warning("background route %s: cannot read %s (%s); at %d requests in flight until it can",
                            self.route, self.server.metrics_url, why, min(FALLBACK_CONCURRENCY, self.ceiling))
            self.metrics_up = False
        elif self.metrics_up is False:
            log.warning("background route %s: %s can be read again; paced by it", self.route, self.server.metrics_url)
            self.metrics_up = True
        else:
            self.metrics_up = True
        self.load = load
        return load

    async def _scrape(self) -> str:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=METRICS_TIMEOUT_SECONDS))
        async with self._session.get(self.server.metrics_url) as reply:
            if reply.status != 200:
                raise ValueError(f"HTTP {reply.status}")
            if (reply.content_length or 0) > MAX_METRICS_BYTES:
                raise ValueError("the scrape is too large")
            raw = await reply.content.read(MAX_METRICS_BYTES + 1)
            if len(raw) > MAX_METRICS_BYTES:
                raise ValueError("the scrape is too large")
            return raw.decode()


__all__ = ["BackgroundRoute", "priority_refused"]
