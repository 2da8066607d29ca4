-- commit.lua: mark a reservation committed after the ledger committed it (checkout),
-- and take it out of the expiry index so the sweeper leaves it alone. Best effort:
-- the sweeper repairs a missed mark when it finds the ledger row COMMITTED.
--
-- KEYS[1] meta  KEYS[2] index  KEYS[3] res
-- ARGV[1] reservation key
--
-- Returns 1 marked now, 2 already committed, 0 no reservation hash (index cleaned)
--
-- Run twice: safe. The second run finds the hash committed and answers 2.
local key = ARGV[1]
local r = redis.call('HMGET', KEYS[3], 's', 'q')
if not r[1] then
  redis.call('ZREM', KEYS[2], key)
  return 0
end
if r[1] ~= 'R' then
  redis.call('ZREM', KEYS[2], key)
  return 2
end
redis.call('HSET', KEYS[3], 's', 'C')
redis.call('ZREM', KEYS[2], key)
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'rsv', -tonumber(r[2]))
end
return 1
