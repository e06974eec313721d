-- Rebuild a tenant's counts from its live leases and report how far they
-- were off.
-- KEYS[1]  the tenant's leases, KEYS[2] the tenant's count
-- ARGV[1]  prefix of user count keys
-- ARGV[2]  TTL ms of the count keys
-- ARGV[3..] users whose counts to check even without a live lease
-- Returns {leases expired, total difference, live leases}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keyTTL = tonumber(ARGV[2])

local expired = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local counts, users = {}, {}
for _, m in ipairs(live) do
  local u = string.sub(m, 18)
  if counts[u] == nil then counts[u] = 0; users[#users + 1] = u end
  counts[u] = counts[u] + 1
end
for i = 3, #ARGV do
  local u = ARGV[i]
  if counts[u] == nil then counts[u] = 0; users[#users + 1] = u end
end

local diff = 0
for _, u in ipairs(users) do
  local k = ARGV[1] .. u
  local have = tonumber(redis.call('GET', k) or '0') or 0
  local want = counts[u]
  diff = diff + math.abs(have - want)
  if want > 0 then redis.call('SET', k, want, 'PX', keyTTL) else redis.call('DEL', k) end
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
