-- stamp.lua: record this server's run_id in a shard's meta (srv) when the meta
-- has none yet: shards seeded before the meta recorded it. The caller has
-- verified that the data is this server's (see reserve.lua).
--
-- KEYS[1] meta
--
-- Returns 1 stamped, 0 nothing to do (no meta, already stamped, being rebuilt)
--
-- Run twice: safe. The second run finds srv recorded and answers 0.
local cur = redis.call('HMGET', KEYS[1], 'state', 'srv')
if not cur[1] or cur[2] or cur[1] == 'REBUILDING' then
  return 0
end
local srv = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
redis.call('HSET', KEYS[1], 'srv', srv)
return 1
