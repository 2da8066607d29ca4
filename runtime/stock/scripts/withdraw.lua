-- withdraw.lua: take units out of a shard's stock for an allocation decrease that
-- is not recorded yet (or give them back). Withdrawn units can never be reserved;
-- the meta counts them in `wd` until adjust.lua settles the recorded decrease. A
-- rebuild from the ledger drops unrecorded withdrawals, restoring the stock.
--
-- KEYS[1] stock  KEYS[2] meta
-- ARGV[1] units: > 0 to withdraw at most this many (less when the stock is lower),
--                < 0 to give back at most this many withdrawn units
-- ARGV[2] the ledger's epoch the caller read (0: any)
--
-- Returns {units moved (withdrawn > 0, given back < 0), units withdrawn now in total},
-- {0, -1} when there is no meta (rebuild first), or {0, -2} when the shard is
-- being rebuilt or was rebuilt at another epoch (read the ledger again)
--
-- Run twice: NOT safe. The second run withdraws the units again. Never re-sent by a
-- client library (stock.script: NoRetry); a caller that got no answer reads the
-- shard (its wd) before it withdraws again.
local cur = redis.call('HMGET', KEYS[2], 'state', 'epoch')
if not cur[1] then
  return {0, -1}
end
if cur[1] == 'REBUILDING' or (tonumber(ARGV[2]) ~= 0 and tonumber(cur[2]) ~= tonumber(ARGV[2])) then
  return {0, -2}
end
local n = tonumber(ARGV[1])
local wd = tonumber(redis.call('HGET', KEYS[2], 'wd') or '0')
local moved = 0
if n > 0 then
  local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
  moved = math.min(n, stock)
elseif n < 0 then
  moved = -math.min(-n, wd)
end
if moved ~= 0 then
  redis.call('DECRBY', KEYS[1], moved)
  redis.call('HINCRBY', KEYS[2], 'wd', moved)
end
return {moved, wd + moved}
