-- seed.lua: write a shard's first stock and meta. Never overwrites a live shard:
-- when the meta exists the shard is left exactly as it is.
--
-- KEYS[1] stock  KEYS[2] meta
-- ARGV[1] stock units  ARGV[2] epoch  ARGV[3] gate state  ARGV[4] last applied change id
--
-- The meta records this server's run_id (srv) and master_replid (lin): see reserve.lua.
--
-- Returns 1 seeded, 0 already live (untouched)
--
-- Run twice: safe for the state: the second run finds the meta and answers 0.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
local info = redis.call('INFO', 'server', 'replication')
local srv, lin = string.match(info, 'run_id:(%x+)'), string.match(info, 'master_replid:(%x+)')
redis.call('HSET', KEYS[2], 'state', ARGV[3], 'epoch', ARGV[2], 'rsv', 0, 'alloc', ARGV[1], 'chg', ARGV[4], 'srv', srv, 'lin', lin)
return 1
