"""The `Backend` interface: how a shard's requests get executed.

`providers.litellm_backend` (upstream, through LiteLLM's Router),
`providers.native.runner` (upstream batch jobs) and `local_engine.backend`
(in-process vLLM) each provide one. The runtime knows nothing else about
them: what is special to one backend hangs on the optional hooks below.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

from gateway.domain import BatchRequest, Endpoint, Result, Shard


@runtime_checkable
class Backend(Protocol):
    """Executes requests for one route and yields results as they finish.

    Contract:
    - `execute` yields exactly one `Result` per request given, in any order,
      as each finishes; it never raises for a single request's failure (a
      provider error becomes that request's `Result` with the provider's
      status code and error body).
    - It bounds its own concurrency; the pipeline may call `execute` for
      several shards at once and expects them to share that bound
      (`gateway.backends.bounded.run_bounded` does it for a call per request).
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
    which shard it runs, so it can find the jobs it created before a restart. `rerun`: 0 for the shard's first
    pass, n for its n-th round of re-runs (replies that did not match their schema), whose jobs are the
    round's own."""

    def execute_shard(self, shard: Shard, requests: Sequence[BatchRequest],
                      rerun: int = 0) -> AsyncIterator[Result]: ...


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
