-- commit.lua: mark a reservation committed after the ledger committed it (checkout),
-- and take it out of the expiry index so the sweeper leaves it alone. Best effort:
-- the sweeper repairs a missed mark when it finds the ledger row COMMITTED.
--
-- KEYS[1] meta  KEYS[2] index  KEYS[3] res  KEYS[4] paying (pay.lua; every outcome but 5
--         takes the reservation out of it: nothing is left for the sweeper to settle)
-- ARGV[1] reservation key
-- ARGV[2], ARGV[3] (optional) the ledger row's quantity and expiry ms, for a reservation
--         whose hash is gone (past its backstop TTL) while its expiry-index entry says
--         its units still count as reserved
-- ARGV[4] the committed hash's lifetime in seconds (the backstop): it answers retries
--         of the paid request until then; a held reservation's hash has none
--
-- Returns 1 marked now, 2 already committed, 0 no reservation hash (index cleaned),
--   3 no hash: counted as sold from the ledger row (ARGV[2..3]),
--   4 no hash but an index entry: call again with the ledger row; nothing changed,
--   5 the shard is being rebuilt: nothing changed (the rebuild owns its reserved
--     count, from the ledger; the sweeper marks the reservation once it is done)
--
-- Run twice: safe. The second run finds the hash committed and answers 2.
if redis.call('HGET', KEYS[1], 'state') == 'REBUILDING' then
  return 5
end
local key = ARGV[1]
redis.call('ZREM', KEYS[4], key)
local r = redis.call('HMGET', KEYS[3], 's', 'q')
if not r[1] then
  local score = redis.call('ZSCORE', KEYS[2], key)
  if score and (ARGV[2] == nil or ARGV[2] == '') then
    return 4
  end
  redis.call('ZREM', KEYS[2], key)
  local qty = tonumber(ARGV[2] or '0') or 0
  if score and qty > 0 and tonumber(score) == tonumber(ARGV[3]) and redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'rsv', -qty)
    return 3
  end
  return 0
end
if r[1] ~= 'R' then
  redis.call('ZREM', KEYS[2], key)
  return 2
end
redis.call('HSET', KEYS[3], 's', 'C')
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('ZREM', KEYS[2], key)
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'rsv', -tonumber(r[2]))
end
return 1
