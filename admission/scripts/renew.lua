-- Renew a node's leases of one tenant. A lease that is missing (Redis lost
-- it, or the connection was admitted on local limits while Redis was down)
-- is written again with its counts, without a cap check: the connection is
-- already open, and counting it is what keeps the fleet's caps honest.
-- The leases are read and written with one command each, whatever their
-- number, and the users' count keys are left alone unless a lease was
-- missing: their TTL outlasts the reconcile, which refreshes them.
-- Every key carries the tenant's hash tag: one Redis Cluster slot.
-- KEYS[1]    the tenant's leases, KEYS[2] the tenant's count
-- KEYS[2+i]  the count of the user of lease i (conn:{t}:user:<user>)
-- ARGV[1]    lease TTL ms
-- ARGV[2]    TTL ms of the tenant's keys
-- ARGV[3]    TTL ms of the users' count keys
-- ARGV[3+i]  lease i's member
-- Returns the number of leases written again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
local keyTTL, userTTL = tonumber(ARGV[2]), tonumber(ARGV[3])
local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 4))
local readded = 0
local zadd = {}
for i = 4, #ARGV do
  if not scores[i - 3] then
    local uk = KEYS[i - 1]
    redis.call('INCR', uk)
    redis.call('PEXPIRE', uk, userTTL)
    redis.call('INCR', KEYS[2])
    readded = readded + 1
  end
  zadd[#zadd + 1] = expiry
  zadd[#zadd + 1] = ARGV[i]
end
redis.call('ZADD', KEYS[1], unpack(zadd))
redis.call('PEXPIRE', KEYS[1], keyTTL)
redis.call('PEXPIRE', KEYS[2], keyTTL)
return readded
