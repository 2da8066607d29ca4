-- window.lua: write the sale's schedule into a shard's meta, where the
-- reserve script enforces it with the Redis clock whatever the gate says, so
-- that a sale ends on time, and does not open early, even when no operator
-- is there to write its gate (see reserve.lua).
--
-- KEYS[1] meta
-- ARGV[1] start, ms since the epoch ('': none)
-- ARGV[2] end, ms since the epoch ('': none)
--
-- Returns 1 written, 0 no meta (the shard lost its data: nothing is written,
-- the rebuild or the seed comes first)
--
-- Run twice: safe. It writes two fields; writing them again changes nothing.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if ARGV[1] == '' then
  redis.call('HDEL', KEYS[1], 'ws')
else
  redis.call('HSET', KEYS[1], 'ws', ARGV[1])
end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'we')
else
  redis.call('HSET', KEYS[1], 'we', ARGV[2])
end
return 1
