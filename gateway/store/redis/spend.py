"""A team's spend on the shared store, exact and atomic per team, though a batch's keys and its team's
ledger are in different hash slots (`gateway.store.redis.keys`).

Two steps, each one script in one slot:
1. `RedisLedger.record_results` (the batch's slot) journals the new lines and adds their cost to the
   batch's `spend-owed` hash, field `{team}:{period}`: the USD the batch has ever owed that team's budget
   period. Same step as the journal, so it is exactly the cost of what the journal holds (a line recorded
   twice costs once).
2. `move` (the team's slot) brings the team's `spend` up to date with one batch's owed totals: for each
   period it adds `owed - moved` when positive and sets `moved = owed` (`{t}:spend-moved`, field
   `{batch}:{period}`). Idempotent, and totals only grow: two workers' moves of one batch, in either
   order, add each USD once.

A crash between the two leaves owed > moved: the batch's next `record_results` moves the rest, and so does
the finalizer (`settle`), so a finished batch's spend is whole. The budget checks read `{t}:spend` as before.
Nothing here runs for results without cost (no budget, or a free model): the hot path keeps one round trip.
"""

from __future__ import annotations

from typing import Any, cast

from gateway.store.redis.keys import Keys

# KEYS: {t}:spend-moved, {t}:spend. ARGV: batch id, then pairs of period, owed total (USD).
_MOVE = """
for i = 2, #ARGV, 2 do
  local field = ARGV[1] .. ':' .. ARGV[i]
  local moved = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  local owed = tonumber(ARGV[i + 1])
  if owed > moved then
    redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], owed - moved)
    redis.call('HSET', KEYS[1], field, ARGV[i + 1])
  end
end
return 1
"""


def owed_field(team: str, period: int) -> str:
    return f"{team}:{period}"


class SpendMover:
    def __init__(self, client: Any, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._move = client.register_script(_MOVE)

    async def move(self, batch_id: str, team: str, owed: dict[str, str]) -> None:
        """Bring `team`'s spend up to the batch's `owed` totals (period -> USD, as Redis wrote them)."""
        if not owed:
            return
        args: list[str] = [batch_id]
        for period, total in sorted(owed.items()):
            args += [period, total]
        await self._move(keys=[self._k.spend_moved(team), self._k.spend(team)], args=args)

    async def settle(self, batch_id: str) -> None:
        """Move whatever the batch still owes any team (after a crash between the two steps)."""
        raw = cast(dict[str, str], await self._r.hgetall(self._k.spend_owed(batch_id)))
        by_team: dict[str, dict[str, str]] = {}
        for field, total in raw.items():
            team, _, period = field.rpartition(":")
            by_team.setdefault(team, {})[period] = total
        for team, owed in sorted(by_team.items()):
            await self.move(batch_id, team, owed)


__all__ = ["SpendMover", "owed_field"]
