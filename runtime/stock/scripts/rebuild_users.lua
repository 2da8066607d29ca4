-- rebuild_users.lua: restore the per-user quota of users whose home is this shard,
-- while it is being rebuilt. Called in batches.
--
-- KEYS[1] meta  KEYS[2] users  KEYS[3] claims
-- ARGV[1] the rebuild's epoch
-- ARGV[2..] pairs: field, value (user -> units held; p:<key> -> "<shard>|<expiry>";
--           p:<key>|b -> "<qty>|<user>", the pointer's buyer, see quota.lua)
--
-- A pointer also goes into the claims index, scored by its expiry (later than
-- the claim time it replaces), so the sweeper still settles its quota if giving
-- it back ever fails (quota.lua reap).
--
-- Returns the number of fields written, or -1 when the shard is not being rebuilt
-- under this epoch
--
-- Run twice: safe. HSET and ZADD of the same values change nothing.
local cur = redis.call('HMGET', KEYS[1], 'state', 'epoch')
if cur[1] ~= 'REBUILDING' or tonumber(cur[2]) ~= tonumber(ARGV[1]) then
  return -1
end
if #ARGV < 3 then
  return 0
end
-- One HSET and at most one ZADD per call: a command per field would cost
-- Redis several times more per buyer.
redis.call('HSET', KEYS[2], unpack(ARGV, 2))
local claims = {}
for i = 2, #ARGV, 2 do
  local field = ARGV[i]
  -- "p:", and not a pointer's buyer ("|b": a buyer's digits read as a pointer)
  if string.byte(field, 1) == 112 and string.byte(field, 2) == 58 and string.sub(field, -2) ~= '|b' then
    local expiry = string.match(ARGV[i + 1], '^%d+|(%d+)$')
    if expiry then
      claims[#claims + 1] = expiry
      claims[#claims + 1] = string.sub(field, 3)
    end
  end
end
if #claims > 0 then
  redis.call('ZADD', KEYS[3], unpack(claims))
end
return (#ARGV - 1) / 2
