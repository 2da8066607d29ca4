-- rebuild_finish.lua: last step of a rebuild: write the stock, then the meta with the
-- gate state. The meta goes last so the shard admits nothing before it is whole.
--
-- KEYS[1] stock  KEYS[2] meta
-- ARGV[1] stock  ARGV[2] epoch  ARGV[3] gate state  ARGV[4] shard allocation
-- ARGV[5] last applied change id
--
-- The meta records this server's run_id (srv): the stock now agrees with the ledger
-- on this server (see reserve.lua).
--
-- Returns 1, or -1 when the shard is not being rebuilt under this epoch
--
-- Run twice: not safe for the caller. The second run finds the shard no longer
-- REBUILDING and answers -1, failing a rebuild that succeeded. Never re-sent by a
-- client library (stock.script: NoRetry).
local cur = redis.call('HMGET', KEYS[2], 'state', 'epoch')
if cur[1] ~= 'REBUILDING' or tonumber(cur[2]) ~= tonumber(ARGV[2]) then
  return -1
end
redis.call('SET', KEYS[1], ARGV[1])
local srv = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
redis.call('HSET', KEYS[2], 'alloc', ARGV[4], 'chg', ARGV[5], 'srv', srv, 'state', ARGV[3])
return 1
