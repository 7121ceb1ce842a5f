"""A shared server's load, and the concurrency a `batch_mode: background` route may use on it.

The route's requests fill what the server's live traffic leaves idle. Its allowed concurrency follows the
server's own load, read from its Prometheus `/metrics` (vLLM's `vllm:num_requests_waiting` and
`vllm:num_requests_running`, for the route's `model_name`), by AIMD (additive increase, multiplicative
decrease: Chiu and Jain, 1989, TCP's congestion window): halve while requests wait at the server, add one a
step while none waits and the limit is what holds the route back. AIMD because the server publishes no
capacity to aim at (its running count only says how busy it is, not how busy it may be), so it must be
probed; because several senders that each follow it converge to an equal, full share (the proof of Chiu and
Jain), which is what N workers on one server are; and because it backs off at once, in a single step, when
live requests start to queue, while a model-based controller first has to learn the server.

The allowed concurrency is shared by every worker of a deployment (`ConcurrencyShares`: the contract this
module owns; the embedded store keeps it in SQLite, the shared one in Redis, `LocalShares` in a process):
- one AIMD step per interval, whoever takes it: a step is a compare-and-set on the state's `version`, so two
  workers that read the same state never both halve it;
- each worker holds a part (`grant`): its equal share of `allowed` among the workers that want some (none
  gets more than it wants), and never more than the others leave free, so the workers together stay within
  `allowed` whatever order they ask in. A worker that stops asking drops out after `ttl`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
STEP_SECONDS = 0.25  # how often /metrics is read and the allowed concurrency stepped
FALLBACK_CONCURRENCY = 2  # while /metrics cannot be read: low and fixed, never full speed
SHARE_TTL_SECONDS = 5.0  # a worker that asked no more for this long holds nothing


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What the server said of the route's model when last read."""

    waiting: int  # requests queued at the server (live and ours)
    running: int  # requests the server is executing


def read_load(text: str, model: str) -> ServerLoad | None:
    """The load of `model` in a Prometheus text scrape (summed over its engines); None when the scrape holds
    neither gauge for it (a server of another model, or no vLLM). Raises ValueError on a malformed body."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (WAITING, RUNNING):
            continue
        for sample in family.samples:
            if sample.name == family.name and sample.labels.get("model_name") == model:
                found[family.name] = found.get(family.name, 0.0) + sample.value
    if not found:
        return None
    return ServerLoad(waiting=round(found.get(WAITING, 0.0)), running=round(found.get(RUNNING, 0.0)))


@dataclass(frozen=True, slots=True)
class Aimd:
    """The allowed concurrency's step (see the module docs)."""

    floor: int = 1
    increase: int = 1
    decrease: float = 0.5

    def step(self, allowed: int, load: ServerLoad, in_use: int, ceiling: int, prioritised: bool = False) -> int:
        """The next allowed concurrency: `in_use` is what the route holds now (every worker's part); it grows
        only while the limit is what holds the route back (RFC 7661: a limit not used is not probed).

        `prioritised`: the server serves our lines after live ones (vLLM's priority scheduling), so a short
        queue is ours and costs a live request at most a wait for the next free slot: up to an eighth of the
        server's running count may wait before it backs off. Without it, any request waiting is too many."""
        if load.waiting > (max(1, load.running // 8) if prioritised else 0):
            return max(self.floor, min(ceiling, int(allowed * self.decrease)))
        if in_use >= allowed - 1:
            return max(self.floor, min(ceiling, allowed + self.increase))
        return max(self.floor, min(ceiling, allowed))


@dataclass(frozen=True, slots=True)
class ShareAsk:
    """One worker's turn at a route's shared concurrency."""

    route: str
    worker: str
    want: int  # requests it has (in flight and waiting for a slot)
    held: int  # requests it has in flight now
    now: float  # seconds (time.time())
    initial: int  # `allowed` of a route no one has stepped yet
    proposal: tuple[int, int] | None = None  # (the version it stepped from, the new allowed): a step
    ttl: float = SHARE_TTL_SECONDS


@dataclass(frozen=True, slots=True)
class ShareState:
    """A route's shared concurrency, as a worker's turn left it."""

    allowed: int  # every worker's requests together, at most
    version: int  # steps taken so far
    stepped_at: float  # when the last step was taken (0: never)
    reserved: int  # what the live workers hold together (this one's part included)
    grant: int  # this worker's part


def exchange(state: dict[str, Any] | None, ask: ShareAsk) -> tuple[dict[str, Any], ShareState]:
    """The rule of a turn, on the stored state (a JSON object; `{}` or None: none yet). The Redis store runs the
    same rule in Lua (`gateway.store.redis.concurrency`); `tests/servers/test_lua_parity.py` holds them equal."""
    st = dict(state) if state else {}
    allowed = int(st.get("allowed", ask.initial))
    version = int(st.get("version", 0))
    stepped_at = float(st.get("stepped_at", 0.0))
    if ask.proposal is not None and ask.proposal[0] == version:
        allowed, version, stepped_at = int(ask.proposal[1]), version + 1, ask.now
    workers = {name: entry for name, entry in (st.get("workers") or {}).items()
               if name != ask.worker and float(entry[2]) > ask.now}
    others = sum(int(entry[1]) for entry in workers.values())
    fair = _waterfill(allowed, sorted(int(entry[0]) for entry in workers.values()), ask.want)
    grant = max(0, min(fair, allowed - others))
    reserved = max(grant, ask.held)
    workers[ask.worker] = [ask.want, reserved, ask.now + ask.ttl]
    new = {"allowed": allowed, "version": version, "stepped_at": stepped_at, "workers": workers}
    return new, ShareState(allowed, version, stepped_at, others + reserved, grant)


def _waterfill(total: int, others: list[int], mine: int) -> int:
    """My part of `total` split equally among the wanting (sorted `others` and me), none given more than it
    wants: the smaller wants are met first and what they leave is split among the rest."""
    left, remaining = len(others) + 1, total
    for want in others:
        if mine <= want:
            break
        give = min(want, remaining // left)
        remaining -= give
        left -= 1
    return min(mine, remaining // left)


class ConcurrencyShares(Protocol):
    """Where a route's shared concurrency lives: the `Coordination` of either store (handed in: scheduling
    imports no store)."""

    async def share_concurrency(self, ask: ShareAsk) -> ShareState:
        """One turn (`exchange`), atomic against every other worker's."""


class LocalShares:
    """`ConcurrencyShares` within one process (a backend used outside a runtime: tests, a direct call)."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, Any]] = {}

    async def share_concurrency(self, ask: ShareAsk) -> ShareState:
        self._states[ask.route], state = exchange(self._states.get(ask.route), ask)
        return state


__all__ = [
    "FALLBACK_CONCURRENCY", "RUNNING", "SHARE_TTL_SECONDS", "STEP_SECONDS", "WAITING", "Aimd", "ConcurrencyShares",
    "LocalShares", "ServerLoad", "ShareAsk", "ShareState", "exchange", "read_load",
]
