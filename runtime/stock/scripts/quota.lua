-- quota.lua: the user's quota on the HOME shard, for reservations placed on another
-- shard (stealing). The per-user limit is only ever decided here, on the home shard.
--
-- KEYS[1] users  hash: <user> -> units held; p:<key> -> pointer
-- ARGV[1] op: confirm - the claimed reservation was placed: pointer := ARGV[5]
--             unclaim - no shard had stock: give the claimed quota back
--             release - a stolen reservation was released: give its quota back
-- ARGV[2] user id
-- ARGV[3] reservation key
-- ARGV[4] quantity
-- ARGV[5] pointer "<shard>|<expiry>" (confirm only)
--
-- Returns 1 when it changed something, 0 when the pointer was not in the expected state
-- (already done, or lost with the data), so a retried call never counts twice.
local field = 'p:' .. ARGV[3]
local ptr = redis.call('HGET', KEYS[1], field)
local op = ARGV[1]
if op == 'confirm' then
  if ptr ~= 'c' then
    return 0
  end
  redis.call('HSET', KEYS[1], field, ARGV[5])
  return 1
end
if not ptr then
  return 0
end
if op == 'unclaim' and ptr ~= 'c' then
  return 0
end
redis.call('HDEL', KEYS[1], field)
redis.call('HINCRBY', KEYS[1], ARGV[2], -tonumber(ARGV[4]))
return 1
