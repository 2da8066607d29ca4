-- pay.lua: the paying index of ONE shard, which bounds how long a checkout cut
-- off between its ledger commit and its Redis step (commit.lua) leaves the unit
-- counted twice (COMMITTED in the ledger, RESERVED in Redis). A checkout marks
-- the reservation paying before it commits in the ledger; commit.lua unmarks it.
-- The sweeper settles, on its next pass, every marked reservation the ledger has
-- COMMITTED, instead of after its expiry and grace.
--
-- KEYS[1] res     hash of the reservation (see reserve.lua)
-- KEYS[2] paying  zset: reservation key -> marked at (ms, Redis clock)
-- ARGV[1] op: mark | drop
-- ARGV[2] reservation key
-- ARGV[3] mark: the buyer checking out (only their own RESERVED reservation is
--         marked, so the index holds at most one entry per live reservation);
--         drop: the mark's time, as mark returned it or the index holds it
--
-- Returns mark: the mark's time (ms), 0 when the reservation is not the buyer's
--   RESERVED one (nothing to settle: committed already, gone, someone else's);
--   drop: 1 dropped, 0 not (the entry is another mark's, or gone)
--
-- Run twice: safe. A second mark moves the entry to a later time, which only
-- keeps it longer; a second drop finds the entry gone, or with another time
-- (a later checkout's mark), and leaves it.
local key = ARGV[2]
if ARGV[1] == 'mark' then
  local r = redis.call('HMGET', KEYS[1], 's', 'u')
  if r[1] ~= 'R' or r[2] ~= ARGV[3] then
    return 0
  end
  local t = redis.call('TIME')
  local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], at, key)
  return at
end
local score = redis.call('ZSCORE', KEYS[2], key)
if score and tonumber(score) == tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[2], key)
  return 1
end
return 0
