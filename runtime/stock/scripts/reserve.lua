-- reserve.lua: take `qty` units from ONE shard's stock for one user, atomically.
-- Every key shares the shard's hash tag {fs:<campaign>:<shard>}, so the script
-- touches one Redis Cluster slot.
--
-- KEYS[1] stock  string: units available on this shard
-- KEYS[2] meta   hash: state, epoch, rsv (units reserved), alloc, chg, srv, lin, chk, ws, we
--                (see below)
-- KEYS[3] index  zset: reservation key -> expiry (ms since the epoch, Redis clock)
-- KEYS[4] res    hash of this reservation: u user, q qty, s status (R reserved | C committed),
--                e expiry ms, p epoch, h home shard of the user
-- KEYS[5] users  hash (home shard only): <user> -> units the user holds (reserved or
--                committed); p:<key> -> "<shard>|<expiry>" for a reservation placed on
--                another shard, or "c|<stamp>|<qty>|<user>" while it is being
--                placed there (a claim); p:<key>|b -> its buyer (quota.lua)
-- KEYS[6] claims zset (home shard only): reservation key -> claimed at (ms), so that the
--                sweeper finds claims whose placing process died
-- ARGV[1] user id
-- ARGV[2] reservation key (derived by the server, never by the client)
-- ARGV[3] quantity
-- ARGV[4] maxPerUser
-- ARGV[5] business TTL in ms
-- ARGV[6] unused (was the reservation hash's TTL): a held reservation's hash has
--         none, and lives as long as its expiry-index entry, so that the sweeper
--         can always give back its units (commit.lua, release.lua and cancel.lua
--         give what is left of it a lifetime when it ends)
-- ARGV[7] lowest acceptable epoch (0: any)
-- ARGV[8] mode: home  - this is the user's home shard: replay, limit and stock here
--               claim - like home, but when sold out, claim the user's quota so the
--                       caller may try other shards ("steal")
--               steal - another shard; the quota was claimed on the home shard
-- ARGV[9] home shard index of the user (stored in the reservation)
-- ARGV[10] the calling attempt's tag ('' or absent for none): it is part of a claim's stamp, so
--          that an attempt whose reply was lost can tell its own claim (resolve.lua),
--          and an attempt fenced by resolve.lua (field f:<tag> of the reservation hash)
--          does nothing when its call arrives late
--
-- The body is loaded per Redis server: stock.Store replaces SERVER_RUN_ID below with
-- the run_id (INFO server) of the server it loads the script on, after reading it
-- there. meta.srv is the run_id of the server the shard was seeded or rebuilt on.
-- When they differ, the shard's data was written by another server process: a
-- restart from a snapshot or AOF, or a replica promoted by a failover. That data
-- may be older than the ledger (reservations it never saw), so the shard refuses
-- (CLOSED UNVERIFIED) until it is rebuilt. A new server process has an empty
-- script cache, so every caller reloads, and reads the new run_id, before its
-- first reservation there. The run_id is read and the body loaded over one
-- connection, which cannot outlive its server process: a body is never loaded
-- into a process other than the one whose run_id it carries.
--
-- A run id names a process, not its data: a master cut off by a failover that
-- rejoins as a replica of the promoted one (a resync: it now holds that
-- replica's copy, older than its own) and is promoted back keeps its run_id and
-- its script cache. meta.lin is the master_replid (INFO replication) the shard
-- was seeded or rebuilt under. A promotion gives a master a new one and keeps
-- the one before as master_replid2; a master that starts a backlog for its first
-- replica also takes a new one, but clears master_replid2 (nothing was
-- promoted: the new id is recorded). Before it takes stock or quota the script
-- compares them, at most once per 10 ms of the server's clock (meta.chk, the
-- last check): a copy carries the check time of its source, older than a
-- failover and failback can be, so the first call after a failback checks. A
-- promotion since refuses (CLOSED UNVERIFIED), like srv.
--
-- meta.ws and meta.we are the sale's start and end (ms, the Redis clock; absent: no
-- bound), written by window.lua. Outside them the script refuses (CLOSED
-- NOT_STARTED or ENDED) before it takes stock or quota, whatever the gate says:
-- the gate is written by the operator at the schedule's edges, and a sale must
-- end on time when no operator is there to write it (down, no leader, cut off
-- from Redis), nor open early on a manager whose clock runs ahead.
--
-- Returns {code, expiry, epoch, extra, status}
--   1 RESERVED  extra = stock left on this shard
--   2 REPLAY    the same request was reserved before; extra = its shard (-1: here),
--               status = R or C. Nothing is consumed.
--   3 SOLD_OUT  extra = units the user already holds (home and claim modes; 0 in steal
--               mode): a retry of a request whose record Redis no longer has is then
--               answered from the ledger
--   4 LIMIT     extra = units the user already holds
--   5 CLOSED    status = why: NO_META, NOT_STARTED, PAUSED, ENDED, FAIL_CLOSED, REBUILDING,
--               STALE_EPOCH, UNVERIFIED (PAUSED and ENDED after the replay checks: a
--               request placed before is answered REPLAY)
--   6 CLAIMED   sold out here; the quota is claimed for stealing (mode claim);
--               status = the claim's stamp (claimed at, ms, then '.' and the attempt's
--               tag when it has one), which confirming or giving
--               back the claim must name, so that only this attempt's claim is touched;
--               extra = units the user held before the claim
--   7 BUSY      the same request is being placed on another shard right now;
--               status FENCED: this attempt was given up after its reply was lost
--               (nobody waits for this answer)
--
-- Run twice: NOT safe. In claim mode the second run finds its own claim and answers
-- BUSY (the buyer is refused while the claim lives); in the other modes it answers
-- REPLAY instead of RESERVED. Never re-sent by a client library (EVALSHA as a
-- NoRetry command, see stock.Store.runReserve); a NOSCRIPT answer means it did
-- not run, and the caller loads it and runs it (once).
local server = 'SERVER_RUN_ID'
local state = redis.call('HMGET', KEYS[2], 'state', 'epoch', 'srv', 'lin', 'chk', 'ws', 'we')
if not state[1] then
  return {5, 0, 0, 0, 'NO_META'}
end
local epoch = tonumber(state[2]) or 0
-- A paused or ended sale takes nothing, but still answers a retry of a
-- request it placed: that reservation is held, and checkout takes it.
local closed = nil
if state[1] ~= 'OPEN' then
  if state[1] ~= 'PAUSED' and state[1] ~= 'ENDED' then
    return {5, 0, epoch, 0, state[1]}
  end
  closed = state[1]
end
if state[3] and state[3] ~= server then
  return {5, 0, epoch, 0, 'UNVERIFIED'}
end
if epoch < tonumber(ARGV[7]) then
  return {5, 0, epoch, 0, 'STALE_EPOCH'}
end

-- stale: the shard's data came from another replication history (see above).
-- now is TIME's answer; returns stale and now in ms.
local function stale(now)
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local chk = tonumber(state[5] or '0')
  if not state[4] or (ms >= chk and ms < chk + 10) then
    return false, ms
  end
  local info = redis.call('INFO', 'replication')
  local lin = string.match(info, 'master_replid:(%x+)')
  if lin ~= state[4] and string.match(info, 'master_replid2:(%x+)') ~= string.rep('0', 40) then
    return true, ms
  end
  redis.call('HSET', KEYS[2], 'lin', lin, 'chk', ms)
  return false, ms
end

-- outside: why the sale's window (ws, we) refuses at ms, or nil inside it.
local function outside(ms)
  if state[7] and ms >= tonumber(state[7]) then
    return 'ENDED'
  end
  if state[6] and ms < tonumber(state[6]) then
    return 'NOT_STARTED'
  end
  return nil
end

local user, key, mode = ARGV[1], ARGV[2], ARGV[8]
local qty = tonumber(ARGV[3])
local held = 0

local tag = ARGV[10] or ''
local prev = redis.call('HMGET', KEYS[4], 'e', 's', 'f:' .. tag)
if prev[3] then
  return {7, 0, epoch, 0, 'FENCED'}
end
if prev[1] then
  return {2, tonumber(prev[1]), epoch, -1, prev[2]}
end

if mode ~= 'steal' then
  -- One read for the request's pointer and the user's count.
  local mine = redis.call('HMGET', KEYS[5], 'p:' .. key, user)
  local ptr = mine[1]
  if ptr then
    if string.sub(ptr, 1, 1) == 'c' then
      return {7, 0, epoch, 0, ''}
    end
    local sep = string.find(ptr, '|', 1, true)
    return {2, tonumber(string.sub(ptr, sep + 1)), epoch, tonumber(string.sub(ptr, 1, sep - 1)), 'R'}
  end
  held = tonumber(mine[2] or '0')
end
if closed then
  return {5, 0, epoch, 0, closed}
end
if mode ~= 'steal' and held + qty > tonumber(ARGV[4]) then
  return {4, 0, epoch, held, ''}
end

local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
if stock < qty then
  if mode == 'claim' then
    local old, ms = stale(redis.call('TIME'))
    if old then
      return {5, 0, epoch, 0, 'UNVERIFIED'}
    end
    local why = outside(ms)
    if why then
      return {5, 0, epoch, 0, why}
    end
    local at = string.format('%.0f', ms)
    local stamp = at
    if tag ~= '' then
      stamp = at .. '.' .. tag
    end
    redis.call('HINCRBY', KEYS[5], user, qty)
    redis.call('HSET', KEYS[5], 'p:' .. key, 'c|' .. stamp .. '|' .. qty .. '|' .. user)
    redis.call('ZADD', KEYS[6], at, key)
    return {6, 0, epoch, held, stamp}
  end
  return {3, 0, epoch, held, ''}
end

local old, ms = stale(redis.call('TIME'))
if old then
  return {5, 0, epoch, 0, 'UNVERIFIED'}
end
local why = outside(ms)
if why then
  return {5, 0, epoch, 0, why}
end
-- A Lua number goes to redis.call as its digits (an integer below 2^53 has
-- no exponent), so the expiry needs no string.format.
local expiry = ms + tonumber(ARGV[5])
redis.call('DECRBY', KEYS[1], qty)
redis.call('HINCRBY', KEYS[2], 'rsv', qty)
redis.call('HSET', KEYS[4], 'u', user, 'q', qty, 's', 'R', 'e', expiry, 'p', epoch, 'h', ARGV[9])
-- The hash may hold fences already (resolve.lua), with their lifetime.
redis.call('PERSIST', KEYS[4])
redis.call('ZADD', KEYS[3], expiry, key)
if mode ~= 'steal' then
  redis.call('HINCRBY', KEYS[5], user, qty)
end
return {1, expiry, epoch, stock - qty, 'R'}
