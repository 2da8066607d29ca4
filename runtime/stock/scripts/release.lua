-- release.lua: give a reserved reservation's units back to its shard's stock, once.
-- Used by the sweeper (after the ledger says the order is cancelled or abandoned)
-- and by the API when it could not write the ledger row.
--
-- KEYS[1] stock  KEYS[2] meta  KEYS[3] index  KEYS[4] res  KEYS[5] users
-- ARGV[1] reservation key
-- ARGV[2] this shard's index (to know whether the user's quota lives here)
--
-- Returns {code, user, qty, home, expiry}
--   1 RELEASED      units are back; when home ~= this shard the caller releases the
--                   user's quota on the home shard (quota.lua release, naming this
--                   shard and expiry)
--   0 NOT_FOUND     no reservation hash (already released, or never here); index cleaned
--   2 NOT_RESERVED  the reservation is committed; only the index is cleaned
--   4 BUSY          the shard is being rebuilt; try again on the next pass
local state = redis.call('HGET', KEYS[2], 'state')
if not state then
  return {0, '', 0, -1, 0}
end
if state == 'REBUILDING' then
  return {4, '', 0, -1, 0}
end
local key = ARGV[1]
local r = redis.call('HMGET', KEYS[4], 's', 'u', 'q', 'h', 'e')
if not r[1] then
  redis.call('ZREM', KEYS[3], key)
  return {0, '', 0, -1, 0}
end
if r[1] ~= 'R' then
  redis.call('ZREM', KEYS[3], key)
  return {2, r[2], tonumber(r[3]), tonumber(r[4]), tonumber(r[5])}
end
local qty = tonumber(r[3])
redis.call('INCRBY', KEYS[1], qty)
redis.call('HINCRBY', KEYS[2], 'rsv', -qty)
redis.call('ZREM', KEYS[3], key)
redis.call('DEL', KEYS[4])
if tonumber(r[4]) == tonumber(ARGV[2]) and redis.call('HINCRBY', KEYS[5], r[2], -qty) <= 0 then
  redis.call('HDEL', KEYS[5], r[2]) -- per-buyer state goes at zero
end
return {1, r[2], qty, tonumber(r[4]), tonumber(r[5])}
