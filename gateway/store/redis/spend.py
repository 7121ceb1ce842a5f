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
the finalizer (`settle`), so a finished batch's spend is whole. The budget checks read `{t}:spend`: one key
per team, whatever its batches.
Nothing here runs for results without cost (no budget, or a free model): the hot path keeps one round trip.

`settle` is the batch's last move, and it trims what the batch left in its team's `spend-moved` (else one
field per batch and period, for ever). The finalizer calls it once every shard is sealed (`seal_shard`), so
`record_results` ignores the batch's results from then on and its `spend-owed` is final. In this order:
1. read the batch's `spend-owed` (its slot): the final totals;
2. per team, one script in the team's slot: unless the batch's tombstone `{t}:spend-settled:{batch}` is
   there, add `owed - moved`, delete the batch's `spend-moved` fields and write the tombstone (with a TTL),
   together; a `move` (step 2 above) finds the tombstone and does nothing: one of a `record_results` whose
   lines were journaled before the seal and whose move comes late is already in the final totals;
3. delete the batch's `spend-owed`: a `settle` run again (a finalizer that died after this) finds nothing
   owed and moves nothing. One that died between 2 and 3 and runs again finds the tombstone: nothing moves
   twice, unless the re-run comes after the tombstone's TTL (a day; the sweep re-runs a finalizer within
   seconds of its lease lapsing).
"""

from __future__ import annotations

from typing import Any, cast

from gateway.store.redis.keys import Keys

SETTLED_TTL_SECONDS = 24 * 3600  # how long a settled batch's tombstone turns away late moves (see above)

# KEYS: {t}:spend-moved, {t}:spend, {t}:spend-settled:{batch}. ARGV: batch id, final ('1': settle, '0': a
# move), the tombstone's TTL, then pairs of period, owed total (USD). Nothing once the batch is settled.
_MOVE = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local final = ARGV[2] == '1'
for i = 4, #ARGV, 2 do
  local field = ARGV[1] .. ':' .. ARGV[i]
  local moved = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  local owed = tonumber(ARGV[i + 1])
  if owed > moved then
    redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], owed - moved)
    if not final then redis.call('HSET', KEYS[1], field, ARGV[i + 1]) end
  end
  if final then redis.call('HDEL', KEYS[1], field) end
end
if final then redis.call('SET', KEYS[3], '1', 'EX', ARGV[3]) end
return 1
"""


def owed_field(team: str, period: int) -> str:
    return f"{team}:{period}"


class SpendMover:
    def __init__(self, client: Any, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._move = client.register_script(_MOVE)

    async def move(self, batch_id: str, team: str, owed: dict[str, str], *, final: bool = False) -> None:
        """Bring `team`'s spend up to the batch's `owed` totals (period -> USD, as Redis wrote them); `final`:
        the batch's last (see the module's docstring)."""
        if not owed:
            return
        args: list[str | int] = [batch_id, "1" if final else "0", SETTLED_TTL_SECONDS]
        for period, total in sorted(owed.items()):
            args += [period, total]
        keys = [self._k.spend_moved(team), self._k.spend(team), self._k.spend_settled(team, batch_id)]
        await self._move(keys=keys, args=args)

    async def settle(self, batch_id: str) -> None:
        """The batch's last move: whatever it still owes any team, then its trace trimmed (see the module's
        docstring for the order). Only once every shard of the batch is sealed."""
        owed_key = self._k.spend_owed(batch_id)
        raw = cast(dict[str, str], await self._r.hgetall(owed_key))
        by_team: dict[str, dict[str, str]] = {}
        for field, total in raw.items():
            team, _, period = field.rpartition(":")
            by_team.setdefault(team, {})[period] = total
        for team, owed in sorted(by_team.items()):
            await self.move(batch_id, team, owed, final=True)
        if raw:
            await self._r.delete(owed_key)


__all__ = ["SETTLED_TTL_SECONDS", "SpendMover", "owed_field"]
