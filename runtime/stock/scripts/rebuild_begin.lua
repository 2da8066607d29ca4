-- rebuild_begin.lua: first step of rebuilding a shard from the ledger. Closes the
-- shard (state REBUILDING, new epoch) and wipes what it held, so that nothing the
-- ledger does not know about survives (e.g. a reservation whose ledger write was
-- fenced). Committed reservation hashes outside the index are left to their backstop.
--
-- KEYS[1] stock  KEYS[2] meta  KEYS[3] index  KEYS[4] users  KEYS[5] claims
-- ARGV[1] new epoch  ARGV[2] key prefix of reservation hashes ("{fs:<c>:<n>}:res:")
--
-- Returns the number of reservation hashes deleted
--
-- Run twice: safe. The second run wipes an already wiped shard (answering 0 hashes
-- deleted); only the rebuild, which holds the campaign's lock, writes it meanwhile.
local members = redis.call('ZRANGE', KEYS[3], 0, -1)
for _, key in ipairs(members) do
  redis.call('DEL', ARGV[2] .. key)
end
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'state', 'REBUILDING', 'epoch', ARGV[1], 'rsv', 0)
return #members
