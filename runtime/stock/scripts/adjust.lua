-- adjust.lua: apply one recorded allocation change to a shard, exactly once.
-- The meta remembers the last change id applied, so a repeated call is a no-op.
-- An increase adds units to the stock. A decrease settles units that withdraw.lua
-- already took out of the stock: they leave the shard's allocation for good.
--
-- KEYS[1] stock  KEYS[2] meta
-- ARGV[1] change id (increasing)
-- ARGV[2] delta of the shard's allocation (units; negative for a decrease)
-- ARGV[3] units to add to the stock now (the delta for an increase, 0 for a decrease)
-- ARGV[4] withdrawn units this change settles (0 for an increase)
-- ARGV[5] the ledger's epoch the caller read (0: any)
--
-- A shard being rebuilt, or rebuilt at another epoch than the caller read, is
-- refused: a rebuild writes the stock and the last change id from its own
-- snapshot of the ledger, and would undo (or miss) a change applied under it.
--
-- Returns 1 applied, 0 already applied, -1 no meta (rebuild first),
--         -2 being rebuilt or another epoch (read the ledger again)
--
-- Run twice: safe. The second run finds the change id applied and answers 0.
local cur = redis.call('HMGET', KEYS[2], 'state', 'epoch')
if not cur[1] then
  return -1
end
if cur[1] == 'REBUILDING' or (tonumber(ARGV[5]) ~= 0 and tonumber(cur[2]) ~= tonumber(ARGV[5])) then
  return -2
end
if tonumber(redis.call('HGET', KEYS[2], 'chg') or '0') >= tonumber(ARGV[1]) then
  return 0
end
redis.call('INCRBY', KEYS[1], ARGV[3])
redis.call('HINCRBY', KEYS[2], 'alloc', ARGV[2])
local settled = tonumber(ARGV[4])
if settled ~= 0 then
  redis.call('HINCRBY', KEYS[2], 'wd', 0 - settled)
end
redis.call('HSET', KEYS[2], 'chg', ARGV[1])
return 1
