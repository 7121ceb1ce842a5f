"""Team budgets (LiteLLM's `max_budget` USD per `budget_duration`), over the quota ledger's spend counter.

Spend is the cost the runner already puts on each result (LiteLLM's price for an upstream call, the
route's `model_info` prices otherwise), added by the store in the step that journals the results
(`SpendTo`), so every process and a restarted one see one figure, and a crash between the two cannot
happen. Over budget: the service refuses new batches and the runner stops
sending (`gateway.pipeline.shard_runner`).

A backend that commits money in bulk (a native route's provider batch job) reserves its estimated cost before
each commitment (`reserve_now`): the hold is taken in the store's one atomic step that reads the spend and the
other holds (`QuotaLedger.reserve`), so spend never passes `max_budget` by a job; the lines that do not fit are
not sent. The hold is let go once the results it stood for are recorded (`settled_now`: after the runner's next
journal write, so the cost is never counted in neither) or when the batch ends (the finalizer). The runner says
whose budget its requests spend with `spending_for` (a context variable, like
`gateway.scheduling.fairness.running_for`, so the `Backend` interface keeps its shape).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

from gateway.config.schema import Config
from gateway.domain import Result, billable
from gateway.errors import OverQuota
from gateway.store.protocols import QuotaLedger
from gateway.store.quota import SpendTo, budget_period

_EXACT_TRIES = 4  # readings of a budget that overlapped a journal write before one is taken as it is


class _Writes:
    """Journal writes under way per team, for a budget's reading to know whether one overlapped it."""

    def __init__(self) -> None:
        self._started: dict[str, int] = {}
        self._running: dict[str, int] = {}
        self._done: dict[str, asyncio.Event] = {}

    def started(self, team: str) -> int:
        return self._started.get(team, 0)

    def quiet(self, team: str) -> bool:
        return not self._running.get(team, 0)

    def begin(self, team: str) -> None:
        self._started[team] = self._started.get(team, 0) + 1
        self._running[team] = self._running.get(team, 0) + 1

    def end(self, team: str) -> None:
        self._running[team] -= 1
        if not self._running[team]:
            del self._running[team]
            done = self._done.pop(team, None)
            if done is not None:
                done.set()

    async def wait_quiet(self, team: str) -> None:
        if not self.quiet(team):
            await self._done.setdefault(team, asyncio.Event()).wait()


class Budgets:
    def __init__(self, config: Config, ledger: QuotaLedger | None) -> None:
        self._ledger = ledger
        self._teams = {t.team_id: t for t in config.batch.teams}
        self._mode = config.batch.budget_reservation
        # team -> the cost of this process's results not yet journaled (a runner's buffer): counted as spent
        self._unrecorded: dict[str, float] = {}
        self._writes = _Writes()

    def limit(self, team: str) -> float | None:
        settings = self._teams.get(team)
        return settings.max_budget if settings is not None else None

    def period(self, team: str, at: float | None = None) -> int:
        settings = self._teams.get(team)
        return budget_period(settings.budget_seconds if settings is not None else None, at or time.time())

    def spend_to(self, team: str) -> SpendTo:
        """Where the cost of results recorded now goes: the team's current budget period."""
        return SpendTo(team, self.period(team))

    async def spent(self, team: str) -> float:
        return 0.0 if self._ledger is None else await self._ledger.spend(team, self.period(team))

    async def over(self, team: str) -> bool:
        """The team has spent its budget for this period (never, without a `max_budget`): what the store holds,
        and what this process's results cost that it has not journaled yet, each result counted once.

        A result's cost leaves this process's count only once the store holds it (`TeamSpending.journal`), and the
        count is read before the store: a reading never misses a result, but one that overlapped a journal write
        may count its results twice. So a reading under the budget stands, and one at or over it stands only when
        no write of the team's overlapped it; else it is read again once the writes are done."""
        limit = self.limit(team)
        if limit is None:
            return False
        for _ in range(_EXACT_TRIES):
            began, quiet = self._writes.started(team), self._writes.quiet(team)
            unrecorded = self._unrecorded.get(team, 0.0)
            if await self.spent(team) + unrecorded < limit:
                return False
            if quiet and self._writes.started(team) == began:
                return True
            await self._writes.wait_quiet(team)
        return True  # writes kept overlapping the reading: counted twice at worst, never less

    def unrecorded(self, team: str, usd: float) -> None:
        """`usd` more (less, once journaled) of the team's results wait in this process to be journaled."""
        if usd:
            left = self._unrecorded.get(team, 0.0) + usd
            if left > 1e-12:
                self._unrecorded[team] = left
            else:
                self._unrecorded.pop(team, None)

    @contextlib.asynccontextmanager
    async def journaling(self, team: str) -> AsyncIterator[None]:
        """A write that moves results of the team's from this process's count into the store's spend."""
        self._writes.begin(team)
        try:
            yield
        finally:
            self._writes.end(team)

    def teams_with_budgets(self) -> list[str]:
        return [t for t, settings in self._teams.items() if settings.max_budget is not None]

    def reserves_at_create(self, team: str) -> bool:
        """A create of the team's reserves its batch's estimate (`budget_reservation: estimate`, and a budget)."""
        settings = self._teams.get(team)
        if settings is None or settings.max_budget is None:
            return False
        return (settings.budget_reservation or self._mode) == "estimate"

    async def standing(self, team: str) -> tuple[float, float]:
        """(spent this period, held by the team's running batches and jobs) in USD."""
        if self._ledger is None:
            return 0.0, 0.0
        return await self.spent(team), sum((await self._ledger.reserved(team)).values())

    async def hold_estimate(self, team: str, holder: str, usd: float) -> None:
        """Hold `usd` (a batch's estimate) for `holder` if the budget, less the spend and the other holds, has
        room for it; else refuse it as OpenAI refuses a call past a quota (429 `insufficient_quota`)."""
        if await self.reserve(team, holder, [usd]) == 1:
            return
        spent, held = await self.standing(team)
        limit = self.limit(team) or 0.0
        raise OverQuota(f"You exceeded your current quota: this batch's estimated cost, {usd:.6f} USD, is more than "
                        f"team {team!r} has left of its budget, {max(limit - spent - held, 0.0):.6f} USD (max_budget "
                        f"{limit} USD, spent {spent:.6f} USD, held by running batches {held:.6f} USD). Try a "
                        "smaller batch, or again once running batches have finished.", code="insufficient_quota")

    async def shrink(self, team: str, holder: str, usd: float) -> None:
        if self._ledger is not None and usd:
            await self._ledger.shrink(team, holder, usd)

    async def reserve(self, team: str, holder: str, costs: Sequence[float]) -> int:
        """Hold for `holder` the cost of as many of `costs` (from the first) as the team's budget has room for,
        counting what is spent and held already, in one atomic step; how many fit (all: no budget)."""
        limit = self.limit(team)
        if limit is None or self._ledger is None:
            return len(costs)
        return await self._ledger.reserve(team, self.period(team), holder, costs, limit)

    async def unreserve(self, team: str, prefix: str) -> None:
        """Let go of the team's holds whose holder starts with `prefix` (nothing held without a budget)."""
        if self._ledger is not None and self.limit(team) is not None:
            await self._ledger.unreserve(team, prefix)


def create_hold(batch_id: str, created_at: float) -> str:
    """The hold a batch takes of its whole estimate at create (the sweeper reads when it was made from it)."""
    return f"{batch_id}/create/{int(created_at)}/"


def hold_made_at(holder: str) -> float | None:
    """When a create's hold was taken (epoch seconds); None for another hold."""
    _, kind, made = holder.rstrip("/").partition("/create/")
    return float(made) if kind and made.isdigit() else None


OverBudget = Callable[[], Awaitable[bool]]  # is the team whose requests these are over its budget now?


class TeamSpending:
    """Whose budget the current requests spend (one shard's): is it spent, what its results cost until they are
    journaled, and its holds, let go of once the results they stood for are recorded (`journal`).

    A result is counted as spent where its request's slot is released (`finished`, called by
    `gateway.backends.bounded` before the slot can start another request), so a request never starts on a budget
    that does not show every result before it; a result no slot counted (a native job's) is counted when the
    runner takes it (`buffered`). Each is counted once."""

    def __init__(self, budgets: Budgets, team: str, create_hold: str | None = None,
                 price: Callable[[Result], None] | None = None) -> None:
        # `create_hold`: the batch's hold of its whole estimate, taken at create (`budget_reservation: estimate`);
        # it covers every line of the batch, so a native job reserves nothing more, and it shrinks as results
        # are recorded. `price`: gives a result its route's prices when its backend did not.
        self._budgets, self.team, self._create_hold, self._price = budgets, team, create_hold, price
        self._settled: list[str] = []
        self._buffered = 0.0  # what this shard's results not yet journaled cost
        self._counted: set[int] = set()  # the results (by id) counted at their slot, not yet taken by the runner

    @property
    def budgeted(self) -> bool:
        return self._budgets.limit(self.team) is not None

    async def over(self) -> bool:
        return await self._budgets.over(self.team)

    async def reserve(self, holder: str, costs: Sequence[float]) -> int:
        if self._create_hold is not None:
            return len(costs)  # held whole at create
        return await self._budgets.reserve(self.team, holder, costs)

    def settled(self, holder: str) -> None:
        self._settled.append(holder)

    async def release(self, holder: str) -> None:
        await self._budgets.unreserve(self.team, holder)

    def finished(self, result: Result) -> None:
        """A request's result, as its slot is released: priced, and spent from now on for the budget's checks."""
        if id(result) not in self._counted:
            self._counted.add(id(result))
            self._count(result)

    def buffered(self, result: Result) -> None:
        """The runner holds `result` to journal it: priced, and spent from now on (already, if its slot counted
        it)."""
        if id(result) in self._counted:
            self._counted.discard(id(result))
        else:
            self._count(result)

    def _count(self, result: Result) -> None:
        if self._price is not None:
            self._price(result)
        usd = billable(result.cost_usd)
        if usd and self.budgeted:
            self._buffered += usd
            self._budgets.unrecorded(self.team, usd)

    async def journal(self, write: Awaitable[float]) -> None:
        """Journal results (`write`, which says what they cost): their cost moves from this process's count into
        the store's spend, with no reading of the budget seeing it in neither (`Budgets.over`); it leaves the
        batch's hold, and the holds that the results yielded before them settled go."""
        async with self._budgets.journaling(self.team):
            usd = min(await write, self._buffered)
            if usd > 0:
                self._buffered -= usd
                self._budgets.unrecorded(self.team, -usd)
        if usd > 0 and self._create_hold is not None:
            await self._budgets.shrink(self.team, self._create_hold, usd)
        while self._settled:
            await self._budgets.unreserve(self.team, self._settled.pop())

    def close(self) -> None:
        """The shard's run ended: results counted but never journaled (a run cancelled with results unread)
        were not spent, as far as the ledger knows; this process stops counting them."""
        if self._buffered > 0:
            self._budgets.unrecorded(self.team, -self._buffered)
        self._buffered = 0.0
        self._counted.clear()


class _OverOnly:
    """A budget known only by whether it is spent: a job fits whole until it is."""

    budgeted = True

    def __init__(self, over: OverBudget) -> None:
        self.over = over

    async def reserve(self, holder: str, costs: Sequence[float]) -> int:
        return 0 if await self.over() else len(costs)

    def settled(self, holder: str) -> None:
        return None

    async def release(self, holder: str) -> None:
        return None

    def finished(self, result: Result) -> None:
        return None


_current: contextvars.ContextVar[TeamSpending | _OverOnly | None] = contextvars.ContextVar(
    "batchyard_budget", default=None)


@contextlib.contextmanager
def spending_for(spending: TeamSpending | OverBudget | None) -> Iterator[None]:
    """Requests started in this block (and tasks created in it) spend this budget (a bare `OverBudget`: one
    known only by whether it is spent)."""
    current = spending if spending is None or isinstance(spending, TeamSpending) else _OverOnly(spending)
    token = _current.set(current)
    try:
        yield
    finally:
        _current.reset(token)


def budgeted() -> bool:
    """Whether the current requests spend a team's budget (the team has a `max_budget`): a line whose cost
    cannot be known is refused then (`price_unknown`: providers.litellm_backend)."""
    return _current.get() is not None


async def over_budget_now() -> bool:
    """The budget the current requests spend is spent (never, outside `spending_for`: no team, no budget)."""
    current = _current.get()
    return current is not None and await current.over()


def current_spending() -> TeamSpending | _OverOnly | None:
    """The budget the current requests spend (None: none), for a run that checks it per request."""
    return _current.get()


def budgeted_now() -> bool:
    """A budget applies to the current requests (a team with a `max_budget`)."""
    current = _current.get()
    return current is not None and current.budgeted


async def reserve_now(holder: str, costs: Sequence[float]) -> int:
    """Reserve for `holder` the cost of as many of `costs` (from the first) as the current budget has room for;
    how many fit (all, outside `spending_for`)."""
    current = _current.get()
    return len(costs) if current is None else await current.reserve(holder, costs)


def settled_now(holder: str) -> None:
    """The results `holder` reserved for are yielded: its hold goes once they are recorded."""
    current = _current.get()
    if current is not None:
        current.settled(holder)


async def release_now(holder: str) -> None:
    """`holder` will spend nothing more (its job was never made): its hold goes now."""
    current = _current.get()
    if current is not None:
        await current.release(holder)


__all__ = ["Budgets", "OverBudget", "TeamSpending", "budgeted_now", "create_hold", "current_spending", "hold_made_at",
           "over_budget_now", "release_now", "reserve_now", "settled_now", "spending_for"]
