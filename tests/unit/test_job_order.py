"""The validation processes' order (`gateway.runtime.job_order.JobOrder`): never more jobs in the pool than it has
places, and a job whose caller waits is let in before the plans that queued earlier; a job that leaves while
waiting loses its place in line, and one that leaves just as it was let in passes the place on."""

from __future__ import annotations

import asyncio

from gateway.runtime.job_order import JobOrder


async def _job(order: JobOrder, name: str, urgent: bool, started: list[str], release: asyncio.Event) -> None:
    async with order.slot(urgent):
        started.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_at_most_the_places_run_and_a_callers_job_goes_before_queued_plans() -> None:
    async def scenario() -> list[str]:
        order, started = JobOrder(2), list[str]()
        gates = {name: asyncio.Event() for name in ("plan1", "plan2", "plan3", "plan4", "estimate")}
        tasks = [asyncio.create_task(_job(order, name, False, started, gates[name]))
                 for name in ("plan1", "plan2", "plan3", "plan4")]
        await _settle()
        assert started == ["plan1", "plan2"]  # two places: the other plans wait outside the pool
        tasks.append(asyncio.create_task(_job(order, "estimate", True, started, gates["estimate"])))
        await _settle()
        assert started == ["plan1", "plan2"]
        gates["plan1"].set()
        await _settle()
        assert started == ["plan1", "plan2", "estimate"]  # the caller's job takes the first place freed
        for gate in gates.values():
            gate.set()
        await asyncio.gather(*tasks)
        return started

    assert asyncio.run(scenario()) == ["plan1", "plan2", "estimate", "plan3", "plan4"]


def test_a_job_that_leaves_while_waiting_gives_no_place_away_and_the_count_stays_right() -> None:
    async def scenario() -> list[str]:
        order, started = JobOrder(1), list[str]()
        hold, forever, late = asyncio.Event(), asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(_job(order, "first", False, started, hold))
        await _settle()
        leaving = asyncio.create_task(_job(order, "leaving", True, started, forever))
        waiting = asyncio.create_task(_job(order, "waiting", False, started, late))
        await _settle()
        leaving.cancel()
        await _settle()
        hold.set()
        await first
        await _settle()
        assert started == ["first", "waiting"]
        late.set()
        await waiting
        # one place, free again: a new job starts at once
        again = asyncio.create_task(_job(order, "again", False, started, late))
        await _settle()
        await again
        return started

    assert asyncio.run(scenario()) == ["first", "waiting", "again"]


def test_a_job_cancelled_as_it_is_let_in_passes_its_place_to_the_next() -> None:
    async def scenario() -> list[str]:
        order, started = JobOrder(1), list[str]()
        hold, done = asyncio.Event(), asyncio.Event()
        done.set()
        waiting: list[asyncio.Task[None]] = []

        async def first() -> None:
            async with order.slot(False):
                started.append("first")
                await hold.wait()
            waiting[0].cancel()  # the place was just handed to it: it is cancelled before it runs again

        running = asyncio.create_task(first())
        await _settle()
        waiting.append(asyncio.create_task(_job(order, "unlucky", True, started, done)))
        after = asyncio.create_task(_job(order, "after", False, started, done))
        await _settle()
        hold.set()
        # a place lost with the cancelled job would leave `after` waiting for ever
        await asyncio.wait_for(asyncio.gather(running, waiting[0], after, return_exceptions=True), 5)
        return started

    assert asyncio.run(scenario()) == ["first", "after"]
