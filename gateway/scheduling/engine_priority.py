"""The vLLM `priority` a request gets on a local engine: fair share inside the engine's waiting queue.

A local engine's submission window (`FairSlots`) decides which team's request
enters the engine next, but inside vLLM the waiting queue is first come, first
served: a newcomer's requests would still queue behind every request another
team already has waiting there (up to a window's worth). With vLLM's priority
scheduling (`scheduling_policy: priority`: the waiting queue is a heap on
`(priority, arrival)`, lower first) each request carries the rule of
`gateway.scheduling.fairness` into the engine, as one int64:

    priority = level << 48 | deadline << 16 | line priority

- `level`: the team's requests in the engine when this one is handed to it
  (itself included), per unit of weight, rounded down. A team that already
  holds much of the window submits at a high level; a newcomer's first
  requests at level 1, so they are scheduled before every request another
  team has waiting. When teams share the window by weight (what `FairSlots`
  converges to), their new requests come in at about the same level, and a
  team alone submits at about the same level throughout (its window is full):
  then the next two keys decide.
- `deadline`: the batch's `expires_at` (Unix seconds): earliest deadline first.
- the line's own `priority` (vLLM's body field), if it has one: it orders a
  batch's lines among themselves, clamped to 16 bits so it can never lift a
  line above its team's share or its batch's deadline.

Ties go to the earlier arrival (vLLM's own tiebreak). vLLM 0.32 uses the number
in two places only: the order of its waiting queue, and, when the KV cache runs
out, which running request it preempts (the highest number instead of the
latest arrival). It never preempts a running request to admit a waiting one.
"""

from __future__ import annotations

from typing import Any

from gateway.scheduling.fairness import DEFAULT_WEIGHT, Share

LEVEL_BITS, DEADLINE_BITS, LINE_BITS = 14, 32, 16  # 62 bits: vLLM's field is an int64
_LINE_BIAS = 1 << (LINE_BITS - 1)
_MAX_LEVEL = (1 << LEVEL_BITS) - 1
_MAX_DEADLINE = (1 << DEADLINE_BITS) - 1


def engine_priority(share: Share, in_use: int, line_priority: int = 0) -> int:
    """The priority for a request of `share` when the team has `in_use` requests in the engine (it included)."""
    weight = share.weight if share.weight > 0 else DEFAULT_WEIGHT
    level = min(int(in_use / weight), _MAX_LEVEL)
    deadline = min(max(share.deadline, 0), _MAX_DEADLINE)
    line = min(max(line_priority, -_LINE_BIAS), _LINE_BIAS - 1) + _LINE_BIAS
    return (level << (DEADLINE_BITS + LINE_BITS)) | (deadline << LINE_BITS) | line


def with_priority(body: dict[str, Any], share: Share, in_use: int) -> dict[str, Any]:
    """`body` with the engine priority set (a copy; `body` is left alone).

    A `priority` that is not an int is left as it is, so that vLLM answers the
    line with its own validation error."""
    own = body.get("priority", 0)
    if isinstance(own, bool) or not isinstance(own, int):
        return body
    return {**body, "priority": engine_priority(share, in_use, own)}


__all__ = ["engine_priority", "with_priority"]
