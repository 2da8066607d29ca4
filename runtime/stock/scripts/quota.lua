-- quota.lua: the user's quota on the HOME shard, for reservations placed on another
-- shard (stealing). The per-user limit is only ever decided here, on the home shard.
--
-- KEYS[1] users   hash: <user> -> units held; p:<key> -> pointer: "<shard>|<expiry>"
--                 once placed, "c|<claimed at, ms>|<qty>|<user>" while claimed
-- KEYS[2] claims  zset: reservation key -> claimed at (ms), from the claim until the
--                 quota is given back or the sweeper forgets a sold reservation, so
--                 the sweeper also finds quota whose give-back failed
-- ARGV[1] op: confirm - the claimed reservation was placed: pointer := ARGV[5]
--             unclaim - no shard had stock: give the claimed quota back
--             release - a stolen reservation was released: give its quota back
--             reap    - a claim older than ARGV[5] (ms) whose placing process died:
--                       give its quota back (any reservation placed under it has
--                       expired by then; its release finds no pointer and gives
--                       nothing back twice). A placed pointer is only reported:
--                       the caller decides from the ledger (release or forget)
--             forget  - a placed reservation was sold: the quota stays, the
--                       claims index lets go of it
-- ARGV[2] user id (reap, forget: unused, the user is found from the quota field)
-- ARGV[3] reservation key
-- ARGV[4] quantity (reap, forget: unused)
-- ARGV[5] pointer "<shard>|<expiry>" (confirm) or the cutoff in ms (reap)
--
-- Returns 1 when it changed something, 0 when the pointer was not in the expected state
-- (already done, or lost with the data), so a retried call never counts twice.
-- reap returns {1, ''} (given back), {0, ''} (nothing to do) or {2, pointer} (placed).
--
-- Run twice: safe for the state (above). Still never re-sent by a client library
-- (stock.script: NoRetry), so that a 0 means what it says: done before this call.
local key, op = ARGV[3], ARGV[1]
local field = 'p:' .. key
local ptr = redis.call('HGET', KEYS[1], field)
local claimed = ptr and string.sub(ptr, 1, 1) == 'c'
if op == 'confirm' then
  if not claimed then
    return 0
  end
  redis.call('HSET', KEYS[1], field, ARGV[5])
  return 1
end
if op == 'reap' then
  if not ptr then
    redis.call('ZREM', KEYS[2], key)
    return {0, ''}
  end
  if not claimed then
    return {2, ptr}
  end
  local _, _, at, qty, user = string.find(ptr, '^c|(%d+)|(%d+)|(.*)$')
  if not at then
    redis.call('ZREM', KEYS[2], key) -- not a claim this script can read: leave it
    return {0, ''}
  end
  if tonumber(at) > tonumber(ARGV[5]) then
    return {0, ''}
  end
  redis.call('HDEL', KEYS[1], field)
  redis.call('HINCRBY', KEYS[1], user, -tonumber(qty))
  redis.call('ZREM', KEYS[2], key)
  return {1, ''}
end
if op == 'forget' then
  if claimed then
    return 0
  end
  return redis.call('ZREM', KEYS[2], key)
end
if not ptr then
  return 0
end
if op == 'unclaim' and not claimed then
  return 0
end
redis.call('HDEL', KEYS[1], field)
redis.call('HINCRBY', KEYS[1], ARGV[2], -tonumber(ARGV[4]))
redis.call('ZREM', KEYS[2], key)
return 1
