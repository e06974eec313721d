-- Take a connection slot for a user and its tenant together, and write the
-- connection's lease. Every key carries the tenant's hash tag, so the
-- script touches one Redis Cluster slot, and it touches only keys the
-- caller declared.
-- KEYS[1]  the user's open-connection count   conn:{t}:user:<user>
-- KEYS[2]  the tenant's open-connection count conn:{t}:tenant
-- KEYS[3]  the tenant's leases (sorted set: member <16 hex id>:<user>, score expiry ms)
-- ARGV[1]  lease member
-- ARGV[2]  lease TTL ms
-- ARGV[3]  per-user cap (0: none)
-- ARGV[4]  per-tenant cap (0: none)
-- ARGV[5]  prefix of user count keys (conn:{t}:user:), to know a lease's count key by name
-- ARGV[6]  TTL ms of the tenant's keys
-- ARGV[7]  TTL ms of the user's count key
-- Returns {admitted (1|0), refused by (0 none, 1 user cap, 2 tenant cap),
-- leases expired, expired leases of other users...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keyTTL = tonumber(ARGV[6])

-- Leases of connections whose node stopped renewing them give their slots
-- back first (a bounded number per call; the reconcile takes the rest).
-- Those of this user are purged here. Those of other users are not: their
-- count keys were not declared, so the caller purges them with a call that
-- declares them (release.lua). Until then they are left out of the
-- tenant's count, so the decision is the same as if they were gone.
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
local purged, others = 0, {}
for _, m in ipairs(dead) do
  if ARGV[5] .. string.sub(m, 18) == KEYS[1] then
    if redis.call('DECR', KEYS[1]) <= 0 then redis.call('DEL', KEYS[1]) end
    if redis.call('DECR', KEYS[2]) <= 0 then redis.call('DEL', KEYS[2]) end
    redis.call('ZREM', KEYS[3], m)
    purged = purged + 1
  else
    others[#others + 1] = m
  end
end

local reply = function(admitted, rule)
  local r = {admitted, rule, purged}
  for _, m in ipairs(others) do r[#r + 1] = m end
  return r
end
local userCap, tenantCap = tonumber(ARGV[3]), tonumber(ARGV[4])
if userCap > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') >= userCap then
  return reply(0, 1)
end
if tenantCap > 0 and tonumber(redis.call('GET', KEYS[2]) or '0') - #others >= tenantCap then
  return reply(0, 2)
end
redis.call('INCR', KEYS[1])
redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
-- Counts outlive their leases only briefly when every node holding them is
-- gone: nothing is left behind for good.
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[7]))
redis.call('PEXPIRE', KEYS[2], keyTTL)
redis.call('PEXPIRE', KEYS[3], keyTTL)
return reply(1, 0)
