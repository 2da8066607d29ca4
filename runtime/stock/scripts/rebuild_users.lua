-- rebuild_users.lua: restore the per-user quota of users whose home is this shard,
-- while it is being rebuilt. Called in batches.
--
-- KEYS[1] meta  KEYS[2] users
-- ARGV pairs: field, value (user -> units held; p:<key> -> "<shard>|<expiry>")
--
-- Returns the number of fields written, or -1 when the shard is not being rebuilt
if redis.call('HGET', KEYS[1], 'state') ~= 'REBUILDING' then
  return -1
end
for i = 1, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return #ARGV / 2
