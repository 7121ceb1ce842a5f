"""The Lua scripts of the shared queue (`gateway.store.redis.queue`), each one atomic step in one hash slot.

The layout they keep (keys in `gateway.store.redis.keys`): one stream per (route, team, batch) with the
consumer group `workers`; per (route, team), all in that queue's slot, a sorted set of those streams by the
batch's deadline (`ready`), a set of them (`streams`) and `queued`, which maps a shard key to the entry
carrying it (`entry id@stream`). Every key a script touches is declared or named by a declared key's members
(a stream of the `ready` or `streams` set): all of one (route, team) slot. The route's team registry is
another slot, written by the queue in Python before a PUT.
"""

from __future__ import annotations

# Enqueue (the group is made with the stream, so a stream removed when it emptied comes back whole).
# KEYS: stream, queued, ready, streams. ARGV: field, shard JSON, shard key, group, deadline, only_missing.
PUT = """
if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then return false end
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[4], '0', 'MKSTREAM') end
local id = redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], id .. '@' .. KEYS[1])
redis.call('ZADD', KEYS[3], ARGV[5], KEYS[1])
redis.call('SADD', KEYS[4], KEYS[1])
return id
"""

# Ack, and remove a batch's stream once it carries nothing (its group and consumers go with it).
# KEYS: stream, queued, ready, streams. ARGV: group, entry id, shard key.
ACK = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('HGET', KEYS[2], ARGV[3]) == ARGV[2] .. '@' .. KEYS[1] then redis.call('HDEL', KEYS[2], ARGV[3]) end
if redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[3], KEYS[1])
  redis.call('SREM', KEYS[4], KEYS[1])
end
return 1
"""

# One team's side of the fair claim, in its (route, team) slot, reading nothing: of its first `k` batch
# streams by deadline, each one's deadline, the shards it has pending and whether any wait (entries not read
# yet; a skipped batch's never do). The pick between teams is made in Python from these
# (`gateway.scheduling.fairness.pick`: a team's use is its streams' pending). KEYS: ready.
# ARGV: group, k, skipped batch ids…  Returns {stream, deadline, pending, 1 if waiting else 0, stream, …}.
CANDIDATES = """
local skip = {}
for i = 3, #ARGV do skip[ARGV[i]] = true end
local entries = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1, 'WITHSCORES')
local out = {}
for j = 1, #entries, 2 do
  local stream = entries[j]
  local p = redis.pcall('XPENDING', stream, ARGV[1])
  if type(p) == 'table' and p.err then
    redis.call('ZREM', KEYS[1], stream)  -- the stream is gone (Redis lost it): the sweep enqueues again
  else
    local waiting = 0
    if not skip[string.match(stream, ':([^:]*)$')] and redis.call('XLEN', stream) - p[1] > 0 then waiting = 1 end
    if waiting == 1 or p[1] > 0 then
      out[#out + 1] = stream
      out[#out + 1] = entries[j + 1]
      out[#out + 1] = p[1]
      out[#out + 1] = waiting
    end
  end
end
return out
"""

# Read the next entry of the stream the pick chose, if it still has one (another worker may have emptied
# it since the candidates were read). KEYS: stream. ARGV: group, me. Returns {id, fields} or false.
TAKE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local got = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
if type(got) ~= 'table' or got.err or got[1] == nil then return false end
local entry = got[1][2][1]
if entry == nil then return false end
return {entry[1], entry[2]}
"""

# Keep held entries ours (idle back to zero), or hand them to another consumer.
# ARGV: group, me, target consumer, idle ms ('' for zero), ids…; returns the ids that were no longer ours.
REFRESH = """
local lost = {}
for i = 5, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] ~= nil and p[1][2] == ARGV[2] then
    if ARGV[4] == '' then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[i], 'JUSTID')
    else
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[i], 'IDLE', ARGV[4], 'JUSTID')
    end
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""

# XAUTOCLAIM with a liveness check, over the batch streams of one (route, team) slot. An entry idle for ARGV[3]
# ms is dead when its consumer is in `dead` (read in Python from the workers' heartbeats: no key of another
# slot is read here), or is us but not held any more (`held`: `id@stream`). KEYS: the streams set.
# ARGV: group, me, min idle ms, scan count, 'look' or 'take', {"dead": [...], "held": [...]} JSON.
# 'look' returns the consumers of the idle entries (nothing changes); 'take' makes the first dead one ours
# and returns {stream, id, fields}, or false.
RECLAIM = """
local opts = cjson.decode(ARGV[6])
local dead, held, seen, idle = {}, {}, {}, {}
for _, c in ipairs(opts.dead) do dead[c] = true end
for _, h in ipairs(opts.held) do held[h] = true end
for _, stream in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local pending = redis.pcall('XPENDING', stream, ARGV[1], 'IDLE', ARGV[3], '-', '+', ARGV[4])
  if type(pending) == 'table' and pending.err then pending = {} end
  for _, p in ipairs(pending) do
    if ARGV[5] == 'look' then
      if not seen[p[2]] then seen[p[2]] = true; idle[#idle + 1] = p[2] end
    elseif (p[2] == ARGV[2] and not held[p[1] .. '@' .. stream]) or (p[2] ~= ARGV[2] and dead[p[2]]) then
      local got = redis.call('XCLAIM', stream, ARGV[1], ARGV[2], ARGV[3], p[1])
      if got[1] then return {stream, got[1][1], got[1][2]} end
    end
  end
end
if ARGV[5] == 'look' then return idle end
return false
"""

__all__ = ["ACK", "CANDIDATES", "PUT", "RECLAIM", "REFRESH", "TAKE"]
