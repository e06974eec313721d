-- Token bucket: refill, take one token and set the TTL in one step.
-- KEYS[1]  the bucket (hash: tokens, ts)
-- ARGV[1]  capacity (tokens)
-- ARGV[2]  refill rate (tokens per second)
-- Returns {allowed (1|0), retry after ms, tokens left (floor)}.
-- Time is Redis's own (TIME), so nodes with skewed clocks share one bucket
-- correctly.
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens, ts = capacity, now
end
if now > ts then
  tokens = math.min(capacity, tokens + (now - ts) * rate / 1000)
end

local allowed, wait = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'ts', now)
-- A full bucket is the same as no bucket: the key lives as long as a refill
-- from empty takes, plus a second.
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity * 1000 / rate) + 1000)
return {allowed, wait, math.floor(tokens)}
