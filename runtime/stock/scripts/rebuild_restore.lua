-- rebuild_restore.lua: recreate still-valid pending reservations of a shard being
-- rebuilt, so checkout and the sweeper keep working on them. Called in batches.
--
-- KEYS[1] meta  KEYS[2] index  KEYS[3..] res hashes, one per reservation
-- ARGV[1] backstop TTL seconds
-- ARGV[2] the rebuild's epoch
-- ARGV[3..] six values per reservation: key, user, qty, expiry ms, epoch, home shard
--
-- Returns the number restored, or -1 when the shard is not being rebuilt under
-- this epoch
local cur = redis.call('HMGET', KEYS[1], 'state', 'epoch')
if cur[1] ~= 'REBUILDING' or tonumber(cur[2]) ~= tonumber(ARGV[2]) then
  return -1
end
local n = #KEYS - 2
local units = 0
for i = 1, n do
  local a = 2 + (i - 1) * 6
  local key, user, qty, expiry, epoch, home = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6]
  redis.call('HSET', KEYS[2 + i], 'u', user, 'q', qty, 's', 'R', 'e', expiry, 'p', epoch, 'h', home)
  redis.call('EXPIRE', KEYS[2 + i], ARGV[1])
  redis.call('ZADD', KEYS[2], expiry, key)
  units = units + tonumber(qty)
end
redis.call('HINCRBY', KEYS[1], 'rsv', units)
return n
