-- Sliding window log: at most ARGV[1] requests in any ARGV[2] ms.
-- KEYS[1]  the window (sorted set: member per request, score its time in ms)
-- ARGV[1]  limit
-- ARGV[2]  window in ms
-- ARGV[3]  a unique member for this request
-- Returns {allowed (1|0), retry after ms, remaining}.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local n = redis.call('ZCARD', KEYS[1])
if n < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], window)
  return {1, 0, limit - n - 1}
end
-- Refused: the oldest request in the window leaves it first.
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = window
if oldest[2] ~= nil then
  wait = math.max(1, tonumber(oldest[2]) + window - now + 1)
end
return {0, wait, 0}
