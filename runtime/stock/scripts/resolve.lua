-- resolve.lua: what a reserve call whose reply was lost did on ONE shard, and a fence
-- so that the call, if it has not run yet (it may still be in the server's input
-- buffer after a stall), does nothing when it does.
--
-- KEYS[1] res    hash of the request's reservation on this shard (see reserve.lua);
--                field f:<tag> fences the attempt with that tag
-- KEYS[2] users  hash of this shard (the home shard's holds the request's claim)
-- ARGV[1] reservation key
-- ARGV[2] the attempt's tag (reserve.lua ARGV[10]), not empty
-- ARGV[3] the fence's lifetime in seconds, when it is the hash's only field
--
-- Returns {code, expiry, epoch, status, user, qty, home, stamp, held}
--   1 PLACED  a reservation of this key is on this shard (this attempt's, or an
--             earlier one's: reserve.lua answered REPLAY to a call that found it):
--             expiry, epoch, status, user, qty and home from its hash
--   2 CLAIMED the request's quota is claimed on this (home) shard by this attempt:
--             stamp is the claim's, held what the user held before it
--   0 NONE    the call changed nothing here, or has not run
-- In both PLACED and NONE the attempt is fenced: a call of it that has not run
-- yet takes nothing when it does.
--
-- Run twice: safe. It only reads, and the fence it writes is the same field again.
-- Still never re-sent by a client library (stock.script: NoRetry).
local key, tag = ARGV[1], ARGV[2]
local r = redis.call('HMGET', KEYS[1], 'e', 'p', 's', 'u', 'q', 'h')
if r[1] then
  -- Fenced here too: if the call has not run, it may run after this
  -- reservation ended (release.lua and cancel.lua keep fences), and must not
  -- place another. The hash keeps its own expiry.
  redis.call('HSET', KEYS[1], 'f:' .. tag, 1)
  return {1, tonumber(r[1]), tonumber(r[2]) or 0, r[3] or '', r[4] or '', tonumber(r[5]) or 0,
    tonumber(r[6]) or -1, '', 0}
end
local ptr = redis.call('HGET', KEYS[2], 'p:' .. key)
if ptr then
  local _, _, at, suffix, qty, user = string.find(ptr, '^c|(%d+)([^|]*)|(%d+)|(.*)$')
  if at and suffix == '.' .. tag then
    local held = tonumber(redis.call('HGET', KEYS[2], user) or '0') - tonumber(qty)
    return {2, 0, 0, '', user, tonumber(qty), -1, at .. suffix, held}
  end
end
-- No reservation: the hash holds fences only, and goes with the last of them.
redis.call('HSET', KEYS[1], 'f:' .. tag, 1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {0, 0, 0, '', '', 0, -1, '', 0}
