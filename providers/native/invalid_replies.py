"""A native route's re-runs of replies that did not match their schema (`gateway.pipeline.output_reruns`): one
follow-up provider job per round, at batch price, while the batch's completion window leaves time for it; else
the lines run in real time on the same deployments, at the real-time price.

A provider job takes its own time (minutes to the provider's 24 hours), so "time for it" is judged by the jobs
the shard already ran: a follow-up job is made when what is left of the batch's window is at least
`_MARGIN` times what the round before took, from its jobs' creation to their results read back. A batch
without an expiry (`batchyard run`) always gets a job; one whose earlier jobs' times are unknown (records from
before they were kept) gets one only with a provider's whole window (24 h) left.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from gateway.config.routes import Route
from gateway.domain import BatchRequest, Result, Shard
from gateway.store.protocols import Store
from providers.native.openai_format import Part

if TYPE_CHECKING:
    from providers.litellm_backend import LiteLLMBackend

_MARGIN = 2.0  # a follow-up job may take longer than the round before: twice its time must fit in the window
_PROVIDER_WINDOW = 86_400.0  # the completion window every provider's jobs are made with
_REALTIME_CONCURRENCY = 16  # real-time calls at once for a round's lines


def round_seconds(parts: Sequence[Part], rerun: int) -> float | None:
    """How long round `rerun`'s jobs took, the slowest of them (None: not known)."""
    times = [p.ended_at - p.created_at for p in parts
             if p.rerun == rerun and p.created_at is not None and p.ended_at is not None]
    return max(times) if times else None


async def job_fits(store: Store, shard: Shard, parts: Sequence[Part], rerun: int) -> bool:
    """Whether round `rerun` of the shard's re-runs goes into a provider job (else it runs in real time)."""
    batch = await store.batches.get(shard.batch_id)
    if batch is None or batch.expires_at is None:
        return True
    took = round_seconds(parts, rerun - 1)
    needed = _PROVIDER_WINDOW if took is None else _MARGIN * took
    return batch.expires_at - time.time() >= needed


class Realtime:
    """The route's deployments in real time, through LiteLLM's Router (`providers.litellm_backend`): built on
    first use, so a native route that never needs it builds no Router."""

    def __init__(self, route: Route, router_settings: dict[str, Any]) -> None:
        self._route, self._settings = route, router_settings
        self._backend: LiteLLMBackend | None = None

    async def execute(self, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]:
        if self._backend is None:
            from providers.litellm_backend import LiteLLMBackend

            self._backend = LiteLLMBackend([self._route], self._settings, _REALTIME_CONCURRENCY)
        async for result in self._backend.execute(requests):
            yield result

    async def aclose(self) -> None:
        if self._backend is not None:
            backend, self._backend = self._backend, None
            await backend.aclose()


__all__ = ["Realtime", "job_fits", "round_seconds"]
