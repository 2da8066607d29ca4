-- release.lua: give a reserved reservation's units back to its shard's stock, once.
-- Used by the sweeper (after the ledger says the order is cancelled or abandoned)
-- and by the API when it could not write the ledger row.
--
-- KEYS[1] stock  KEYS[2] meta  KEYS[3] index  KEYS[4] res  KEYS[5] users
-- ARGV[1] reservation key
-- ARGV[2] this shard's index (to know whether the user's quota lives here)
-- ARGV[3..6] (optional) the ledger row's quantity, expiry ms, user and home shard, for a
--         reservation whose hash is gone (it outlived the hash's backstop TTL, say
--         during a long sweeper outage): its expiry-index entry, removed in the same
--         script as every give-back, says its units were never given back. Quantity
--         0: the ledger has no row; only the index entry goes.
-- ARGV[7..8] (optional) the expiry ms and epoch of the placement the caller made: a
--         request that could not record its reservation gives back only its own. A
--         retry of the same request (same key) may have placed another since, after
--         a rebuild or after this one was settled, and been told "reserved". The
--         sweeper gives the expiry it listed and no epoch ('').
-- ARGV[9] the lifetime in seconds of fences left in the hash (stock.FenceTTL): a held
--         reservation's hash has none of its own
--
-- Returns {code, user, qty, home, expiry}
--   1 RELEASED      units are back; when home ~= this shard the caller releases the
--                   user's quota on the home shard (quota.lua release, naming this
--                   shard and expiry)
--   0 NOT_FOUND     no reservation hash (already released, or never here); index cleaned
--   2 NOT_RESERVED  the reservation is committed; only the index is cleaned
--   4 BUSY          the shard is being rebuilt; try again on the next pass
--   5 LEDGER_NEEDED no hash, but the index entry is there: call again with the ledger
--                   row (ARGV[3..6]); nothing changed
--   6 NOT_THIS      the hash is another placement than ARGV[7..8] names; nothing changed
-- Released from the ledger row, the reply carries the row's user, qty, home, expiry.
--
-- Run twice: not safe for the caller. The units go back once, but the second run
-- answers NOT_FOUND, so the caller would not give the home shard's quota back.
-- Never re-sent by a client library (stock.script: NoRetry).
local state = redis.call('HGET', KEYS[2], 'state')
if not state then
  return {0, '', 0, -1, 0}
end
if state == 'REBUILDING' then
  return {4, '', 0, -1, 0}
end
local key = ARGV[1]
local r = redis.call('HMGET', KEYS[4], 's', 'u', 'q', 'h', 'e', 'p')
if r[1] and ARGV[7] and ARGV[7] ~= '' and
    (tonumber(r[5]) ~= tonumber(ARGV[7]) or (ARGV[8] ~= '' and tonumber(r[6]) ~= tonumber(ARGV[8]))) then
  return {6, '', 0, -1, 0}
end
if not r[1] then
  local score = redis.call('ZSCORE', KEYS[3], key)
  if score and (ARGV[3] == nil or ARGV[3] == '') then
    return {5, '', 0, -1, 0}
  end
  redis.call('ZREM', KEYS[3], key)
  local qty = tonumber(ARGV[3] or '0') or 0
  if not score or qty <= 0 or tonumber(score) ~= tonumber(ARGV[4]) then
    return {0, '', 0, -1, 0}
  end
  r = {'R', ARGV[5], ARGV[3], ARGV[6], ARGV[4]}
else
  if r[1] ~= 'R' then
    redis.call('ZREM', KEYS[3], key)
    return {2, r[2], tonumber(r[3]), tonumber(r[4]), tonumber(r[5])}
  end
  -- Fences of attempts whose reply was lost (resolve.lua) outlive the
  -- reservation: a late call of such an attempt must still take nothing.
  if redis.call('HLEN', KEYS[4]) > 6 then
    redis.call('HDEL', KEYS[4], 'u', 'q', 's', 'e', 'p', 'h')
    redis.call('EXPIRE', KEYS[4], ARGV[9])
  else
    redis.call('DEL', KEYS[4])
  end
end
local qty = tonumber(r[3])
redis.call('INCRBY', KEYS[1], qty)
redis.call('HINCRBY', KEYS[2], 'rsv', -qty)
redis.call('ZREM', KEYS[3], key)
if tonumber(r[4]) == tonumber(ARGV[2]) and redis.call('HINCRBY', KEYS[5], r[2], -qty) <= 0 then
  redis.call('HDEL', KEYS[5], r[2]) -- per-buyer state goes at zero
end
return {1, r[2], qty, tonumber(r[4]), tonumber(r[5])}
