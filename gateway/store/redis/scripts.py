"""The Lua scripts of the shared queue (`gateway.store.redis.queue`), each one atomic step in Redis.

The layout they keep (keys in `gateway.store.redis.keys`): one stream per (route,
team, batch) with the consumer group `workers`; per (route, team) a sorted set
of those streams by the batch's deadline (`ready`); per route a hash of its
teams (team -> that sorted set) and a set of all its streams; `queued` maps a
shard key to the entry carrying it (`entry id@stream`).
"""

from __future__ import annotations

# Enqueue (the group is made with the stream, so a stream removed when it emptied comes back whole).
# KEYS: stream, queued, ready, teams, streams. ARGV: field, shard JSON, shard key, group, deadline, team, only_missing.
PUT = """
if ARGV[7] == '1' and redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then return false end
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[4], '0', 'MKSTREAM') end
local id = redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], id .. '@' .. KEYS[1])
redis.call('ZADD', KEYS[3], ARGV[5], KEYS[1])
redis.call('HSET', KEYS[4], ARGV[6], KEYS[3])
redis.call('SADD', KEYS[5], KEYS[1])
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

# The fair claim (`gateway.scheduling.fairness.pick`, the same rule as the embedded queue's): per (route, team) the
# first `k` batch streams by deadline; a team's use is the shards its streams have pending; the pick is the
# waiting stream with the least (use / weight, deadline, its own pending); it is read with XREADGROUP. Cost:
# O(teams x k) calls, whatever the number of shards queued.
# KEYS: the teams hash of each route asked.
# ARGV: group, consumer, k, {"skip": [teams], "skip_batches": [batch ids], "weights": {team: w}} JSON.
CLAIM = """
local group, me, k = ARGV[1], ARGV[2], tonumber(ARGV[3])
local opts = cjson.decode(ARGV[4])
local skip = {}
for _, t in ipairs(opts.skip) do skip[t] = true end
local skip_batch = {}
for _, b in ipairs(opts.skip_batches) do skip_batch[b] = true end
local best, bestkey = nil, nil
local function less(a, b)
  if b == nil then return true end
  for i = 1, 3 do
    if a[i] ~= b[i] then return a[i] < b[i] end
  end
  return false
end
for r = 1, #KEYS do
  local teams = redis.call('HGETALL', KEYS[r])
  for i = 1, #teams, 2 do
    local team, ready = teams[i], teams[i + 1]
    if not skip[team] then
      local entries = redis.call('ZRANGE', ready, 0, k - 1, 'WITHSCORES')
      local held, waiting = 0, {}
      for j = 1, #entries, 2 do
        local stream, deadline = entries[j], tonumber(entries[j + 1])
        local p = redis.pcall('XPENDING', stream, group)
        if type(p) == 'table' and p.err then
          redis.call('ZREM', ready, stream)  -- the stream is gone (Redis lost it): the sweep enqueues again
        else
          held = held + p[1]
          local batch = string.match(stream, ':([^:]*)$')
          if not skip_batch[batch] and redis.call('XLEN', stream) - p[1] > 0 then
            waiting[#waiting + 1] = {stream, deadline, p[1]}
          end
        end
      end
      local w = tonumber(opts.weights[team] or 1)
      for _, c in ipairs(waiting) do
        local key = {held / w, c[2], c[3]}
        if less(key, bestkey) then best, bestkey = c[1], key end
      end
    end
  end
end
if best == nil then return false end
local got = redis.call('XREADGROUP', 'GROUP', group, me, 'COUNT', 1, 'STREAMS', best, '>')
if not got then return false end
local entry = got[1][2][1]
return {best, entry[1], entry[2]}
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

# XAUTOCLAIM with a liveness check, over every stream of the routes asked: the first entry idle for ARGV[3]
# ms whose consumer has no heartbeat key (ARGV[5] .. consumer), or is us but not held any more (held:
# ARGV[6…] as `id@stream`), becomes ours. KEYS: the streams set of each route.
# ARGV: group, me, min idle ms, scan count, heartbeat key prefix, held…; returns {stream, id, fields} or false.
RECLAIM = """
local held = {}
for i = 6, #ARGV do held[ARGV[i]] = true end
for r = 1, #KEYS do
  for _, stream in ipairs(redis.call('SMEMBERS', KEYS[r])) do
    local pending = redis.pcall('XPENDING', stream, ARGV[1], 'IDLE', ARGV[3], '-', '+', ARGV[4])
    if type(pending) == 'table' and pending.err then pending = {} end
    for _, p in ipairs(pending) do
      local dead
      if p[2] == ARGV[2] then
        dead = not held[p[1] .. '@' .. stream]
      else
        dead = redis.call('EXISTS', ARGV[5] .. p[2]) == 0
      end
      if dead then
        local got = redis.call('XCLAIM', stream, ARGV[1], ARGV[2], ARGV[3], p[1])
        if got[1] then return {stream, got[1][1], got[1][2]} end
      end
    end
  end
end
return false
"""

__all__ = ["ACK", "CLAIM", "PUT", "RECLAIM", "REFRESH"]
