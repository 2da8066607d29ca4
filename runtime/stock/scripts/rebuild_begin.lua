-- rebuild_begin.lua: first step of rebuilding a shard from the ledger, called
-- until it returns 0. The first call closes the shard (state REBUILDING, the new
-- epoch): from then on it admits, releases and cancels nothing. Each call then
-- deletes up to ARGV[3] of the reservations the index still holds, so a shard
-- with millions of them never blocks Redis for long; the last one removes the
-- stock, the index, the users hash and the claims, so that nothing the ledger
-- does not know about survives (e.g. a reservation whose ledger write was
-- fenced). Committed reservation hashes outside the index are left to their
-- backstop.
--
-- KEYS[1] stock  KEYS[2] meta  KEYS[3] index  KEYS[4] users  KEYS[5] claims
-- ARGV[1] new epoch  ARGV[2] key prefix of reservation hashes ("{fs:<c>:<n>}:res:")
-- ARGV[3] most reservations deleted by this call
--
-- Returns the reservations still indexed (0: the shard is wiped)
--
-- The meta records this server's run_id (srv) and master_replid (lin):
-- rebuild_finish opens nothing on another process (one restarted from a snapshot
-- or an AOF taken meanwhile, or a replica promoted, holds only part of the
-- rebuild's writes), nor on this one if it was a replica since (a failback: it
-- holds the copy it resynced).
--
-- Run twice: safe. A shard already REBUILDING under this epoch keeps its meta,
-- and deleting what is already gone changes nothing.
--
-- The meta is rewritten in place, never deleted: on a slot being migrated,
-- Redis refuses a write to a key the script deleted, and would stop the script
-- with the shard left without a meta.
local keep = {state = true, epoch = true, rsv = true, srv = true, lin = true, ws = true, we = true}
local cur = redis.call('HMGET', KEYS[2], 'state', 'epoch')
if cur[1] ~= 'REBUILDING' or tonumber(cur[2]) ~= tonumber(ARGV[1]) then
  local info = redis.call('INFO', 'server', 'replication')
  local srv, lin = string.match(info, 'run_id:(%x+)'), string.match(info, 'master_replid:(%x+)')
  redis.call('HSET', KEYS[2], 'state', 'REBUILDING', 'epoch', ARGV[1], 'rsv', 0, 'srv', srv, 'lin', lin)
  -- The rest of the data's fields go; the sale's window (ws, we, written by
  -- window.lua) is the schedule's, not the data's: kept.
  local stale = {}
  for _, f in ipairs(redis.call('HKEYS', KEYS[2])) do
    if not keep[f] then
      stale[#stale + 1] = f
    end
  end
  if #stale > 0 then
    redis.call('HDEL', KEYS[2], unpack(stale))
  end
end
-- Counted before the ZREM, which deletes the index with its last member (a
-- key not read again, as above).
local left = redis.call('ZCARD', KEYS[3])
local members = redis.call('ZRANGE', KEYS[3], 0, tonumber(ARGV[3]) - 1)
for _, key in ipairs(members) do
  redis.call('UNLINK', ARGV[2] .. key)
end
if #members > 0 then
  redis.call('ZREM', KEYS[3], unpack(members))
  left = left - #members
end
if left == 0 then
  -- UNLINK: a users hash of millions of buyers is freed in the background.
  -- The index is gone already, or never was.
  redis.call('UNLINK', KEYS[1], KEYS[4], KEYS[5])
end
return left
