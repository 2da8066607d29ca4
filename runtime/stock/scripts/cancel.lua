-- cancel.lua: a buyer's own cancel, after the ledger row was set CANCELLED_BY_USER.
-- Same as release.lua, but only for the reservation's own user.
--
-- KEYS[1] stock  KEYS[2] meta  KEYS[3] index  KEYS[4] res  KEYS[5] users
-- ARGV[1] reservation key
-- ARGV[2] this shard's index
-- ARGV[3] the user asking
-- ARGV[4] the lifetime in seconds of fences left in the hash (see release.lua)
--
-- Returns {code, user, qty, home, expiry}
--   1 RELEASED  0 NOT_FOUND  2 NOT_RESERVED (committed)  3 WRONG_USER (nothing changed)
--   4 BUSY (shard being rebuilt: the sweeper releases it later from the ledger)
--
-- Run twice: not safe for the caller. The units go back once, but the second run
-- answers NOT_FOUND, which names no buyer: the engine gives the home shard's quota
-- back from the ledger's row then. Never re-sent by a client library
-- (stock.script: NoRetry).
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
  return {0, '', 0, -1, 0}
end
if r[2] ~= ARGV[3] then
  return {3, '', 0, -1, 0}
end
if r[1] ~= 'R' then
  return {2, r[2], tonumber(r[3]), tonumber(r[4]), tonumber(r[5])}
end
local qty = tonumber(r[3])
redis.call('INCRBY', KEYS[1], qty)
redis.call('HINCRBY', KEYS[2], 'rsv', -qty)
redis.call('ZREM', KEYS[3], key)
-- Fences of attempts whose reply was lost (resolve.lua) outlive the
-- reservation: a late call of such an attempt must still take nothing.
if redis.call('HLEN', KEYS[4]) > 6 then
  redis.call('HDEL', KEYS[4], 'u', 'q', 's', 'e', 'p', 'h')
  redis.call('EXPIRE', KEYS[4], ARGV[4])
else
  redis.call('DEL', KEYS[4])
end
if tonumber(r[4]) == tonumber(ARGV[2]) and redis.call('HINCRBY', KEYS[5], r[2], -qty) <= 0 then
  redis.call('HDEL', KEYS[5], r[2]) -- per-buyer state goes at zero
end
return {1, r[2], qty, tonumber(r[4]), tonumber(r[5])}
