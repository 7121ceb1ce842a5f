"""Sending batch webhooks: at least once, retried with backoff for a bounded time, across restarts.

`announce` records the event in the store before its batch takes the status it
announces (see `WebhookDelivery`); nothing is sent from there. The loop, in the
process that sweeps (one at a time, under the `webhooks` lease), picks due
deliveries and sends each in its own task under one total deadline, so a receiver
that is down or slow holds up only its own deliveries, never a batch or another team.
Nothing a receiver sends can hurt the sender: its reply is read up to
`MAX_REPLY_BYTES` (raw bytes: no decompression), within the deadline, and a
redirect is a failed attempt (never followed: a signed event goes only to the
configured URL).

A due delivery whose batch is not finished yet waits (the finalizer records the
event first, then sets the status); one whose batch ended with another status
was superseded (a finalizer re-run chose differently) and is not sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from gateway.domain import BatchStatus
from gateway.log_safe import escaped
from gateway.store.protocols import WebhookDeliveries
from gateway.store.webhook_deliveries import DELIVERED, FAILED, PENDING, SUPERSEDED, WebhookDelivery
from gateway.webhooks.events import BUDGET_THRESHOLD, EVENT_TYPES, WebhookTarget, event_ids, payload, signed_headers

log = logging.getLogger("batchyard.webhooks")

LEASE = "webhooks"
_NOT_FINISHED_WAIT = 2.0  # the batch's status is being set right now: look again soon
_BATCH = 50  # deliveries started per pass at most
# A receiver's reply body is read up to this many bytes, then the connection is dropped: the status is
# all the sender needs, and no receiver can make it hold more (an endless body, a decompression bomb).
MAX_REPLY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class RetrySchedule:
    """Standard Webhooks' advice: back off over hours, then give up. `delays[i]`: seconds before
    attempt i+2 (the last one repeats). A schedule, not an in-process retry loop: each attempt's time is
    recorded in the store (`next_at`), so it holds across restarts and processes; the in-process retries
    of upstream calls are `providers.retry_policy`'s."""

    delays: Sequence[float] = (5, 30, 120, 600, 1800, 3600)
    give_up_after: float = 24 * 3600
    timeout: float = 10.0

    def delay(self, attempts: int) -> float:
        return self.delays[min(attempts, len(self.delays)) - 1] if attempts > 0 else 0.0


class _Batches(Protocol):
    async def get(self, batch_id: str, owner: str | None = None) -> Any: ...


class _Lease(Protocol):
    async def acquire(self, what: str, ttl: float) -> bool: ...
    async def release(self, what: str) -> None: ...


Spawn = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]


class WebhookSender:
    def __init__(
        self, deliveries: WebhookDeliveries, batches: _Batches, lease: _Lease,
        targets: Callable[[str], WebhookTarget | None], *, spawn: Spawn, policy: RetrySchedule | None = None,
        every: float = 1.0, before_pass: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.deliveries, self._batches, self._lease, self._targets = deliveries, batches, lease, targets
        self._spawn = spawn
        self.policy = policy or RetrySchedule()
        self._every = every
        self._before_pass = before_pass
        self._in_flight: set[str] = set()
        self._client: httpx.AsyncClient | None = None

    async def announce(self, owner: str, batch_id: str, status: BatchStatus) -> None:
        """Record the event a batch is about to take `status` for, if its team wants it."""
        event_type = EVENT_TYPES.get(status)
        target = self._targets(owner)
        if event_type is None or target is None or event_type not in target.events:
            return
        webhook_id, event_id = event_ids(batch_id, event_type)
        created = int(time.time())
        if await self.deliveries.add(WebhookDelivery(webhook_id, event_id, owner, batch_id, event_type, created,
                                                     next_at=created)):
            log.info("webhook %s recorded: %s for batch %s (team %s)", webhook_id, event_type, batch_id, owner)

    # -- the loop -------------------------------------------------------------------

    def start(self) -> None:
        self._spawn(self._loop(), "webhooks")

    async def _loop(self) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception as exc:  # the store or Redis is away for a moment: next pass
                log.warning("webhook pass failed: %s", escaped(exc))
            await asyncio.sleep(self._every)

    async def pass_once(self) -> int:
        """Record the events `before_pass` owes (budget alerts), then start every due delivery not in flight;
        returns how many started."""
        if not await self._lease.acquire(LEASE, max(self._every * 3, 5.0)):
            return 0
        started = 0
        try:
            if self._before_pass is not None:
                try:
                    await self._before_pass()
                except Exception as exc:  # the alerts are recorded next pass; the due deliveries go now
                    log.warning("webhook events not recorded this pass: %s", escaped(exc))
            now = time.time()
            for delivery in await self.deliveries.due(now, _BATCH):
                if delivery.id in self._in_flight:
                    continue
                # claimed: not due again (here or in another process) until this attempt had its time
                delivery.next_at = now + self.policy.timeout + _NOT_FINISHED_WAIT
                await self.deliveries.save(delivery)
                self._in_flight.add(delivery.id)
                self._spawn(self._attempt(delivery), f"webhook-{delivery.id}")
                started += 1
        finally:
            await self._lease.release(LEASE)
        return started

    async def _attempt(self, d: WebhookDelivery) -> None:
        try:
            await self._try(d)
        except Exception as exc:
            log.warning("webhook %s: attempt failed: %s", d.id, escaped(exc))
        finally:
            self._in_flight.discard(d.id)

    async def _try(self, d: WebhookDelivery) -> None:
        now = time.time()
        target = self._targets(d.owner)
        if d.type == BUDGET_THRESHOLD:  # a team's event: no batch to wait for
            if target is None or d.type not in target.events:
                await self._finish(d, SUPERSEDED, error="the team no longer wants it")
            else:
                await self._send(d, target)
            return
        batch = await self._batches.get(d.batch_id)
        if batch is None or target is None or d.type not in target.events or (
                batch.status.finished and EVENT_TYPES.get(batch.status) != d.type):
            why = ("the batch is gone" if batch is None else "the team no longer wants it" if target is None
                   or d.type not in target.events else f"the batch ended {batch.status.value}")
            await self._finish(d, SUPERSEDED, error=why)
            return
        if not batch.status.finished:
            if now - d.created_at > self.policy.give_up_after:
                await self._finish(d, FAILED, error="the batch never reached the announced status")
            else:
                d.next_at = now + _NOT_FINISHED_WAIT
                await self.deliveries.save(d)
            return
        await self._send(d, target)

    async def _send(self, d: WebhookDelivery, target: WebhookTarget) -> None:
        body = payload(d.event_id, d.type, d.created_at, d.batch_id, d.data)
        headers = signed_headers(target.secret, d.id, int(time.time()), body)  # signed per attempt: fresh timestamp
        d.attempts += 1
        status: int | None = None
        try:
            # One deadline for the whole attempt (connect, send, reply): httpx's timeout is per read, and a
            # receiver trickling a byte at a time would never trip it.
            async with asyncio.timeout(self.policy.timeout):
                status, whole = await self._post(target.url, body, headers)
            error = (f"HTTP {status}" if not 200 <= status < 300
                     else None if whole else f"HTTP {status} with a reply over {MAX_REPLY_BYTES} bytes")
        except TimeoutError:
            error = f"no reply within {self.policy.timeout:g}s"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        d.last_status, d.last_error = status, error
        if error is None:
            await self._finish(d, DELIVERED)
            return
        retry_at = time.time() + self.policy.delay(d.attempts)
        if retry_at - d.created_at > self.policy.give_up_after:
            await self._finish(d, FAILED, error=error)
            return
        d.next_at = retry_at
        await self.deliveries.save(d)
        log.info("webhook %s %s for batch %s to team %s: %s (attempt %d), next in %.0fs", d.id, d.type,
                 d.batch_id, d.owner, error, d.attempts, retry_at - time.time())

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bool]:
        """POST the event: the receiver's status, and whether its whole reply fit in `MAX_REPLY_BYTES` (one
        that does not is a failed attempt: that receiver is broken). The body is read and dropped (read so
        a short reply leaves the connection reusable; never kept, logged or shown)."""
        async with self._http().stream("POST", url, content=body, headers=headers,
                                       timeout=self.policy.timeout) as reply:
            read = 0
            async for chunk in reply.aiter_raw():
                read += len(chunk)
                if read > MAX_REPLY_BYTES:
                    return reply.status_code, False  # leaving the stream drops the connection: no more is read
            return reply.status_code, True

    async def _finish(self, d: WebhookDelivery, state: str, error: str | None = None) -> None:
        d.state, d.finished_at, d.next_at = state, int(time.time()), 0.0
        if error is not None:
            d.last_error = error
        await self.deliveries.save(d)
        level = logging.INFO if state in (DELIVERED, SUPERSEDED) else logging.WARNING
        log.log(level, "webhook %s %s for batch %s to team %s: %s after %d attempt(s)%s", d.id, d.type,
                d.batch_id, d.owner, state, d.attempts, f" ({d.last_error})" if d.last_error else "")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # no redirects: a signed event goes only to the configured URL
            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


__all__ = ["LEASE", "MAX_REPLY_BYTES", "PENDING", "RetrySchedule", "WebhookSender"]
