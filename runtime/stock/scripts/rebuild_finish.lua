-- rebuild_finish.lua: last step of a rebuild: write the stock, then the meta with the
-- gate state. The meta goes last so the shard admits nothing before it is whole.
--
-- KEYS[1] stock  KEYS[2] meta
-- ARGV[1] stock  ARGV[2] epoch  ARGV[3] gate state  ARGV[4] shard allocation
-- ARGV[5] last applied change id
--
-- The meta records this server's run_id (srv) and master_replid (lin): the stock
-- now agrees with the ledger on this server (see reserve.lua). rebuild_begin
-- recorded the server that began the rebuild; another one, or this one promoted
-- since (a failback), holds only part of the rebuild's writes, and is left
-- closed.
--
-- Returns 1, -1 when the shard is not being rebuilt under this epoch, or -2 when
-- this server, or its replication history, is not the one that began the rebuild
-- (nothing written)
--
-- Run twice: not safe for the caller. The second run finds the shard no longer
-- REBUILDING and answers -1, failing a rebuild that succeeded. Never re-sent by a
-- client library (stock.script: NoRetry).
local cur = redis.call('HMGET', KEYS[2], 'state', 'epoch', 'srv', 'lin')
if cur[1] ~= 'REBUILDING' or tonumber(cur[2]) ~= tonumber(ARGV[2]) then
  return -1
end
local info = redis.call('INFO', 'server', 'replication')
local srv, lin = string.match(info, 'run_id:(%x+)'), string.match(info, 'master_replid:(%x+)')
-- A new master_replid with none before it is a backlog started, not a
-- promotion (see reserve.lua).
local promoted = cur[4] and cur[4] ~= lin and string.match(info, 'master_replid2:(%x+)') ~= string.rep('0', 40)
if (cur[3] and cur[3] ~= srv) or promoted then
  return -2
end
redis.call('SET', KEYS[1], ARGV[1])
-- rb: finished by the rebuild at this epoch, which alone may then open it
-- (gate.lua); a fail close since takes the mark away.
redis.call('HSET', KEYS[2], 'alloc', ARGV[4], 'chg', ARGV[5], 'srv', srv, 'lin', lin, 'state', ARGV[3], 'rb', ARGV[2])
return 1
