"""A `batch_mode: background` route's shared concurrency in Redis: `gateway.scheduling.busy_server.exchange`,
written again in Lua so a worker's turn (read, step, part, write) is one atomic step against every other
worker's. `tests/servers/test_lua_parity.py` runs one table of turns on both and wants the same answers."""

from __future__ import annotations

from typing import Any

from gateway.scheduling.busy_server import ShareAsk, ShareState

STATE_TTL_MS = 3_600_000  # a route no worker has paced for an hour starts afresh

# KEYS[1]: the route's state (JSON: allowed, version, stepped_at, workers: name -> [want, reserved, until]).
# ARGV: worker, want, held, now, initial, ttl, the proposal's version (-1: none), the proposal's allowed.
EXCHANGE = """
local raw = redis.call('GET', KEYS[1])
local st = {}
if raw then st = cjson.decode(raw) end
local worker, want, held, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local initial, ttl, pv, pa = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local allowed = tonumber(st.allowed or initial)
local version = tonumber(st.version or 0)
local stepped_at = tonumber(st.stepped_at or 0)
if pv >= 0 and pv == version then
  allowed, version, stepped_at = pa, version + 1, now
end
local workers, others, wants = {}, 0, {}
if type(st.workers) == 'table' then
  for name, e in pairs(st.workers) do
    if name ~= worker and tonumber(e[3]) > now then
      workers[name] = e
      others = others + tonumber(e[2])
      table.insert(wants, tonumber(e[1]))
    end
  end
end
table.sort(wants)
local left, remaining = #wants + 1, allowed
for _, w in ipairs(wants) do
  if want <= w then break end
  local give = math.min(w, math.floor(remaining / left))
  remaining = remaining - give
  left = left - 1
end
local fair = math.min(want, math.floor(remaining / left))
local grant = math.max(0, math.min(fair, allowed - others))
local reserved = math.max(grant, held)
workers[worker] = {want, reserved, now + ttl}
redis.call('SET', KEYS[1], cjson.encode({allowed = allowed, version = version, stepped_at = stepped_at,
  workers = workers}), 'PX', ARGV[9])
return {allowed, version, tostring(stepped_at), others + reserved, grant}
"""


def arguments(ask: ShareAsk) -> list[Any]:
    version, allowed = ask.proposal if ask.proposal is not None else (-1, 0)
    return [ask.worker, ask.want, ask.held, repr(ask.now), ask.initial, repr(ask.ttl), version, allowed,
            STATE_TTL_MS]


def reply(raw: list[Any]) -> ShareState:
    allowed, version, stepped_at, reserved, grant = raw
    return ShareState(int(allowed), int(version), float(stepped_at), int(reserved), int(grant))


__all__ = ["EXCHANGE", "arguments", "reply"]
