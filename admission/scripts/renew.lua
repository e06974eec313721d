-- Renew a node's leases of one tenant. A lease that is missing (Redis lost
-- it, or the connection was admitted on local limits while Redis was down)
-- is written again with its counts, without a cap check: the connection is
-- already open, and counting it is what keeps the fleet's caps honest.
-- Every key carries the tenant's hash tag: one Redis Cluster slot.
-- KEYS[1]    the tenant's leases, KEYS[2] the tenant's count
-- KEYS[2+i]  the count of the user of lease i (conn:{t}:user:<user>)
-- ARGV[1]    lease TTL ms
-- ARGV[2]    TTL ms of the count keys
-- ARGV[2+i]  lease i's member
-- Returns the number of leases written again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
local keyTTL = tonumber(ARGV[2])
local readded = 0
local users = {}
for i = 3, #ARGV do
  local m = ARGV[i]
  local uk = KEYS[i]
  if not redis.call('ZSCORE', KEYS[1], m) then
    redis.call('INCR', uk)
    redis.call('INCR', KEYS[2])
    readded = readded + 1
  end
  redis.call('ZADD', KEYS[1], expiry, m)
  users[uk] = true
end
for uk in pairs(users) do redis.call('PEXPIRE', uk, keyTTL) end
redis.call('PEXPIRE', KEYS[1], keyTTL)
redis.call('PEXPIRE', KEYS[2], keyTTL)
return readded
