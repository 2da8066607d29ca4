-- gate.lua: open, close, pause or end a shard by writing its meta state.
--
-- KEYS[1] meta
-- ARGV[1] state: OPEN | NOT_STARTED | PAUSED | ENDED | FAIL_CLOSED
-- ARGV[2] epoch the caller believes current (0: any)
-- ARGV[3] optional: change the shard only when its state is this one (a shard
--         in another state is left as it is and counts as set)
-- ARGV[4] optional: '1' when the caller is the rebuild that just finished the
--         shard at epoch ARGV[2], which alone may move it out of FAIL_CLOSED,
--         and only while the shard still carries its mark (rb): a fail close
--         since then (another loss) takes the mark away
--
-- Returns 1 set (or already so), 0 no meta (the shard lost its data: rebuild first),
--        -1 the meta carries another epoch (the caller is stale), -2 being rebuilt,
--        -3 failed closed (only a rebuild opens it: its data is suspect)
--
-- Run twice: safe. It writes a state; writing it again changes nothing.
local cur = redis.call('HMGET', KEYS[1], 'state', 'epoch', 'rb')
if not cur[1] then
  return 0
end
if cur[1] == 'REBUILDING' then
  return -2
end
if tonumber(ARGV[2]) ~= 0 and tonumber(cur[2]) ~= tonumber(ARGV[2]) then
  return -1
end
if ARGV[3] and ARGV[3] ~= '' and cur[1] ~= ARGV[3] then
  return 1
end
if ARGV[1] == 'FAIL_CLOSED' then
  redis.call('HSET', KEYS[1], 'state', ARGV[1])
  redis.call('HDEL', KEYS[1], 'rb')
  return 1
end
if cur[1] == 'FAIL_CLOSED' then
  if ARGV[4] ~= '1' or not cur[3] or tonumber(cur[3]) ~= tonumber(ARGV[2]) then
    return -3
  end
  redis.call('HDEL', KEYS[1], 'rb')
end
redis.call('HSET', KEYS[1], 'state', ARGV[1])
return 1
