-- rebuild_restore.lua: recreate reservations of a shard being rebuilt: the
-- still-valid pending ones, so checkout and the sweeper keep working on them.
-- Called in batches.
--
-- KEYS[1] meta  KEYS[2] index  KEYS[3..] res hashes, one per reservation
-- ARGV[1] the rebuild's epoch
-- ARGV[2..] eight values per reservation: key, user, qty, expiry ms, epoch, home shard,
--           status (R pending: indexed for the sweeper and counted as reserved;
--           C committed: neither), TTL of the hash in seconds (a committed one's; a
--           pending one's hash has none, as reserve.lua writes it)
--
-- Returns the number of reservations in the batch, or -1 when the shard is not
-- being rebuilt under this epoch
--
-- Run twice: safe. The shard was wiped when the rebuild began, so a hash that
-- exists was written by this batch before; it is written again with the same
-- values and not indexed or counted again, so a repeated batch adds nothing to
-- the reserved counter.
local cur = redis.call('HMGET', KEYS[1], 'state', 'epoch')
if cur[1] ~= 'REBUILDING' or tonumber(cur[2]) ~= tonumber(ARGV[1]) then
  return -1
end
local n = #KEYS - 2
local units = 0
local index = {}
for i = 1, n do
  local a = 1 + (i - 1) * 8
  local key, user, qty, expiry, epoch, home, status, ttl =
    ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8]
  if redis.call('HSET', KEYS[2 + i], 'u', user, 'q', qty, 's', status, 'e', expiry, 'p', epoch, 'h', home) > 0 then
    if status == 'R' then
      -- The key may hold fences (resolve.lua), with their lifetime.
      redis.call('PERSIST', KEYS[2 + i])
      index[#index + 1] = expiry
      index[#index + 1] = key
      units = units + tonumber(qty)
    else
      redis.call('EXPIRE', KEYS[2 + i], ttl)
    end
  end
end
if #index > 0 then
  -- One ZADD per batch instead of one per reservation.
  redis.call('ZADD', KEYS[2], unpack(index))
end
redis.call('HINCRBY', KEYS[1], 'rsv', units)
return n
