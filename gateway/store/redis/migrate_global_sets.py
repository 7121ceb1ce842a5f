"""Moving an older deployment's fixed keys to where no team key can be (see `gateway.store.redis.keys`):
one step of `gateway.store.redis.migration`, run on the previous layout's names before they are renamed.

Earlier versions kept three global sets at `batches:active`, `webhooks:due` and
`webhooks:all`: the very keys a team named `active`, `due` or `all` keeps its own
lists at, so such a team read every team's unfinished batches or deliveries. They
are now `active-batches`, `webhooks-due` and `webhooks-all`. Before the migration
renames the previous layout's keys, one script per set (atomic, idempotent) merges what
an old key holds into its new key and leaves in the old key only the members that team
owns: its own list, as the team key it always was (renamed then to the team's slot).
With no such team, the old key ends empty (Redis drops it). The previous layout is
untagged on one Redis, or all in one slot (`{batchyard}:`) on a cluster: either way the
script's keys (and the records it reads) are in one slot.
"""

from __future__ import annotations

from typing import Any

# KEYS: old, new. ARGV: the record key prefix (`…batch:` or `…webhook:`), the team the old key belongs
# to, what to merge ('unfinished': batches not finished; 'pending': deliveries still pending; 'all').
_MOVE = """
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local finished = {['"completed"']=true, ['"failed"']=true, ['"expired"']=true, ['"cancelled"']=true}
for i = 1, #members, 2 do
  local id, score = members[i], members[i + 1]
  local owner, merge = nil, ARGV[3] == 'all'
  if ARGV[3] == 'unfinished' then
    local status
    owner, status = unpack(redis.call('HMGET', ARGV[1] .. id, 'owner', 'status'))
    if owner then owner = cjson.decode(owner) end
    merge = status ~= false and not finished[status]
  else
    local raw = redis.call('GET', ARGV[1] .. id)
    if raw then
      local d = cjson.decode(raw)
      owner = d['owner']
      merge = merge or d['state'] == 'pending'
      if ARGV[3] == 'pending' and merge then score = d['next_at'] end
    end
  end
  if merge and owner then redis.call('ZADD', KEYS[2], 'NX', score, id) end
  if owner ~= ARGV[2] then redis.call('ZREM', KEYS[1], id) end
end
return #members / 2
"""


async def upgrade_key_layout(client: Any, prefix: str) -> int:
    """Move the old fixed keys' members to the new keys, all named in the previous layout under `prefix`
    (`batchyard:`, or `{batchyard}:` on a cluster); returns how many members were looked at."""
    move = client.register_script(_MOVE)
    seen = 0
    for team, old, new, records, what in (
        ("active", "batches:active", "active-batches", "batch:", "unfinished"),
        ("due", "webhooks:due", "webhooks-due", "webhook:", "pending"),
        ("all", "webhooks:all", "webhooks-all", "webhook:", "all"),
    ):
        if await client.exists(prefix + old):
            seen += int(await move(keys=[prefix + old, prefix + new], args=[prefix + records, team, what]))
    return seen


__all__ = ["upgrade_key_layout"]
