-- quota.lua: the user's quota on the HOME shard, for reservations placed on another
-- shard (stealing). The per-user limit is only ever decided here, on the home shard.
-- Every operation names the exact claim or placement it acts on, and changes nothing
-- when the key's pointer is another one: a late or repeated call for an earlier
-- attempt of the same request never touches a later attempt's quota.
--
-- KEYS[1] users   hash: <user> -> units held (the field is deleted when it reaches 0);
--                 p:<key> -> pointer: "<shard>|<expiry>" once placed,
--                 "c|<stamp>|<qty>|<user>" while claimed, the stamp being the
--                 claim's time in ms, then '.' and the claiming attempt's tag if any;
--                 p:<key>|b -> "<qty>|<user>" beside a placed pointer, so that its
--                 quota can be given back when nothing else names the buyer (a
--                 field of its own: a version that reads only the pointer still does)
-- KEYS[2] claims  zset: reservation key -> claimed at (ms), from the claim until the
--                 quota is given back or the sweeper forgets a sold reservation, so
--                 the sweeper also finds quota whose give-back failed
-- ARGV[1] op: confirm - the claim stamped ARGV[6] was placed: pointer := ARGV[5]
--             unclaim - no shard had stock: give back the claim stamped ARGV[6]
--             release - the stolen reservation ARGV[5] was released: give its quota
--                       back, only if the pointer is that reservation's
--             reap    - a claim older than ARGV[5] (ms) whose placing process died:
--                       give its quota back (any reservation placed under it has
--                       expired by then; its release finds no pointer of its own and
--                       gives nothing back twice). A placed pointer is only reported:
--                       the caller decides from the ledger (release or forget)
--             forget  - the placed reservation ARGV[5] was sold: the quota stays, the
--                       pointer and the claims entry go
-- ARGV[2] user id (release only; confirm, unclaim, reap take it from the claim)
-- ARGV[3] reservation key
-- ARGV[4] quantity (release only)
-- ARGV[5] pointer "<shard>|<expiry>" (confirm, release, forget) or the cutoff in ms (reap)
-- ARGV[6] the claim's stamp, from the reserve script's CLAIMED answer (confirm, unclaim)
--
-- Returns 1 when it changed something, 0 when the pointer was not the one named
-- (already done, another attempt's, or lost with the data), so a retried call never
-- counts twice. reap returns {1, ''} (given back), {0, ''} (nothing to do) or
-- {2, pointer, buyer} (placed; buyer '' when the pointer has none).
--
-- Run twice: safe for the state (above). Still never re-sent by a client library
-- (stock.script: NoRetry), so that a 0 means what it says: done before this call.
local key, op = ARGV[3], ARGV[1]
local field = 'p:' .. key
local buyer = field .. '|b'
local ptr = redis.call('HGET', KEYS[1], field)
local claimed = ptr and string.sub(ptr, 1, 1) == 'c'

-- giveBack takes qty units off user's count, deleting the field at zero.
local function giveBack(user, qty)
  if redis.call('HINCRBY', KEYS[1], user, -qty) <= 0 then
    redis.call('HDEL', KEYS[1], user)
  end
end

-- ours: the claim stamped ARGV[6], as {qty, user}, or nil.
local function ours()
  if not claimed or ARGV[6] == nil or ARGV[6] == '' then
    return nil
  end
  local _, _, at, tag, qty, user = string.find(ptr, '^c|(%d+)([^|]*)|(%d+)|(.*)$')
  if not at or at .. tag ~= ARGV[6] then
    return nil
  end
  return {tonumber(qty), user}
end

if op == 'confirm' then
  local c = ours()
  if not c then
    return 0
  end
  redis.call('HSET', KEYS[1], field, ARGV[5], buyer, c[1] .. '|' .. c[2])
  return 1
end
if op == 'unclaim' then
  local c = ours()
  if not c then
    return 0
  end
  redis.call('HDEL', KEYS[1], field)
  giveBack(c[2], c[1])
  redis.call('ZREM', KEYS[2], key)
  return 1
end
if op == 'reap' then
  if not ptr then
    redis.call('ZREM', KEYS[2], key)
    return {0, ''}
  end
  if not claimed then
    return {2, ptr, redis.call('HGET', KEYS[1], buyer) or ''}
  end
  local _, _, at, _, qty, user = string.find(ptr, '^c|(%d+)([^|]*)|(%d+)|(.*)$')
  if not at then
    redis.call('ZREM', KEYS[2], key) -- not a claim this script can read: leave it
    return {0, ''}
  end
  if tonumber(at) > tonumber(ARGV[5]) then
    return {0, ''}
  end
  redis.call('HDEL', KEYS[1], field)
  giveBack(user, tonumber(qty))
  redis.call('ZREM', KEYS[2], key)
  return {1, ''}
end
if ptr ~= ARGV[5] then
  return 0
end
if op == 'forget' then
  redis.call('HDEL', KEYS[1], field, buyer)
  return redis.call('ZREM', KEYS[2], key)
end
if op ~= 'release' then
  return redis.error_reply('quota.lua: unknown op ' .. tostring(op))
end
redis.call('HDEL', KEYS[1], field, buyer)
giveBack(ARGV[2], tonumber(ARGV[4]))
redis.call('ZREM', KEYS[2], key)
return 1
