-- Rebuild a tenant's counts from its live leases and report how far they
-- were off. Every key carries the tenant's hash tag: one Redis Cluster
-- slot; the caller declares the count key of every user it read in the
-- leases, and of every user whose count to check even without a lease.
-- KEYS[1]    the tenant's leases, KEYS[2] the tenant's count
-- KEYS[3..]  user count keys (conn:{t}:user:<user>) to rebuild
-- ARGV[1]    prefix of user count keys, to know a lease's count key by name
-- ARGV[2]    TTL ms of the tenant's keys
-- ARGV[3]    TTL ms of the users' count keys: renewals leave them alone,
--            so this refreshes those of every user with a lease
-- Returns {leases expired, total difference, live leases}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keyTTL, userTTL = tonumber(ARGV[2]), tonumber(ARGV[3])

local expired = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local counts = {}
for _, m in ipairs(live) do
  local k = ARGV[1] .. string.sub(m, 18)
  counts[k] = (counts[k] or 0) + 1
end

-- A live lease whose user the caller did not declare was taken after the
-- caller read the leases, by an acquire that counted it; the next
-- reconcile checks it.
local diff, done = 0, {}
for i = 3, #KEYS do
  local k = KEYS[i]
  if not done[k] then
    done[k] = true
    local have = tonumber(redis.call('GET', k) or '0') or 0
    local want = counts[k] or 0
    diff = diff + math.abs(have - want)
    if want > 0 then redis.call('SET', k, want, 'PX', userTTL) else redis.call('DEL', k) end
  end
end
local have = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
diff = diff + math.abs(have - #live)
if #live > 0 then
  redis.call('SET', KEYS[2], #live, 'PX', keyTTL)
  redis.call('PEXPIRE', KEYS[1], keyTTL)
else
  redis.call('DEL', KEYS[2])
end
return {expired, diff, #live}
