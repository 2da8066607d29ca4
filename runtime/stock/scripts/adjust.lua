-- adjust.lua: apply one recorded allocation change to a shard, exactly once.
-- The meta remembers the last change id applied, so a repeated call is a no-op.
--
-- KEYS[1] stock  KEYS[2] meta
-- ARGV[1] change id (increasing)  ARGV[2] delta units (may be negative)
--
-- Returns 1 applied, 0 already applied, -1 no meta (rebuild first),
--        -2 not enough stock for a negative delta (nothing changed)
if redis.call('EXISTS', KEYS[2]) == 0 then
  return -1
end
if tonumber(redis.call('HGET', KEYS[2], 'chg') or '0') >= tonumber(ARGV[1]) then
  return 0
end
local delta = tonumber(ARGV[2])
if delta < 0 and tonumber(redis.call('GET', KEYS[1]) or '0') < -delta then
  return -2
end
redis.call('INCRBY', KEYS[1], delta)
redis.call('HINCRBY', KEYS[2], 'alloc', delta)
redis.call('HSET', KEYS[2], 'chg', ARGV[1])
return 1
