-- Give back a connection's slot. Only a lease still present gives back its
-- counts, so a release after the lease expired (and was purged), or a second
-- release, changes nothing. The same call purges the lease of a connection
-- whose node stopped renewing it (ARGV[2] = 1): then only once it expired.
-- KEYS[1]  the user's count, KEYS[2] the tenant's count, KEYS[3] the leases
-- ARGV[1]  lease member
-- ARGV[2]  1: purge only an expired lease; 0: release
-- Returns 1 when the lease was there (and, to purge, expired).
local score = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not score then
  return 0
end
if ARGV[2] == '1' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if tonumber(score) > now then return 0 end
end
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('DECR', KEYS[1]) <= 0 then redis.call('DEL', KEYS[1]) end
if redis.call('DECR', KEYS[2]) <= 0 then redis.call('DEL', KEYS[2]) end
return 1
