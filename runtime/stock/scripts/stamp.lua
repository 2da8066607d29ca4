-- stamp.lua: record this server's run_id (srv) and master_replid (lin) in a
-- shard's meta when the meta lacks them: shards seeded before the meta recorded
-- them. The caller has verified that the data is this server's (see
-- reserve.lua); a meta naming another server is left as it is.
--
-- KEYS[1] meta
--
-- Returns 1 stamped, 0 nothing to do (no meta, already stamped, being rebuilt,
-- another server's)
--
-- Run twice: safe. The second run finds both recorded and answers 0.
local cur = redis.call('HMGET', KEYS[1], 'state', 'srv', 'lin')
if not cur[1] or (cur[2] and cur[3]) or cur[1] == 'REBUILDING' then
  return 0
end
local info = redis.call('INFO', 'server', 'replication')
local srv, lin = string.match(info, 'run_id:(%x+)'), string.match(info, 'master_replid:(%x+)')
if cur[2] and cur[2] ~= srv then
  return 0
end
redis.call('HSET', KEYS[1], 'srv', srv, 'lin', lin)
return 1
