"""What a native provider job reserves of its team's budget before it is created: each line's estimated cost at
the deployment's batch prices, so a job never commits money the budget does not hold.

A line's estimate: its input tokens as the cost estimate counts them (`gateway.lines.tokens`: the route's own
tokenizer where one is at hand, else a token per four bytes), and its output bounded by its `max_tokens` /
`max_completion_tokens` (times `n`), else the model's output limit (`model_info.max_output_tokens`, else
LiteLLM's map). A line with no bound at all reserves its input only. The job keeps the lines whose estimates
fit, in order (`gateway.store.quota.fitting`); the rest are not sent.

A hold is named `{batch}/{shard}/{first line}/` (`holder`), so the finalizer lets go of whatever a batch still holds by
its prefix (`batch_holds`) however the batch ended, and a shard run again replaces its part's hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.config.prices import Prices
from gateway.config.routes import Route
from gateway.domain import BatchRequest, Shard
from gateway.lines.budget import budgeted_now, reserve_now
from gateway.lines.tokens import counter_for, output_bound


def holder(shard: Shard, first_line: int, rerun: int = 0) -> str:
    """The hold of one provider job: a shard's part, named by its first line (which a cut keeps, and a
    restart's plan too) and, for a follow-up job of re-runs, its round (never a prefix of another part's)."""
    return f"{shard.batch_id}/{shard.index}/{first_line}{f'r{rerun}' if rerun else ''}/"


def batch_holds(batch_id: str) -> str:
    """The prefix of every hold of a batch."""
    return f"{batch_id}/"


def line_costs(route: Route, prices: Prices | None, requests: Sequence[BatchRequest]) -> list[float]:
    """Each line's estimated cost (USD) at `prices` (nothing without a price: the provider's bill is unknown)."""
    if prices is None:
        return [0.0] * len(requests)
    counter = counter_for(route)
    costs = []
    for req in requests:
        tokens = counter.count(req.url, req.body)
        bound = output_bound(req.url, req.body, tokens, counter.limit) or 0
        costs.append(tokens * prices.input + bound * prices.output)
    return costs


async def reserve_job(hold: str, route: Route, prices: Prices | None, requests: Sequence[BatchRequest]) -> int:
    """Reserve for the job `hold` the estimate of as many of `requests` (from the first) as the budget its
    requests spend has room for; how many fit (all of them where no budget applies, counting nothing)."""
    if not budgeted_now():
        return len(requests)
    costs = await asyncio.to_thread(line_costs, route, prices, requests)  # a tokenizer: off the event loop
    return await reserve_now(hold, costs)


__all__ = ["batch_holds", "holder", "line_costs", "reserve_job"]
