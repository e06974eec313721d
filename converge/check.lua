-- Claims the repair check of tasks for one node of the fleet: KEYS are the
-- tasks' repair markers (keys.Names.Checked), hashes of v (the version
-- PostgreSQL held at the last check, written by the node that checked),
-- at (Unix ms of the last claim, Redis's clock), f (1 when that version
-- was finished) and x (Unix ms when this script last set the marker's
-- TTL). ARGV[1] is how long a claim holds, in ms; ARGV[2] is 1 when
-- finished tasks are checked too; ARGV[3] is the marker's TTL, in ms. The
-- TTL is set again once half of it has passed, not on every claim: a
-- command per watched task and round less.
--
-- Replies, per key, -1 when the task is not this caller's to check (another
-- node claimed it less than ARGV[1] ago, or it was finished and ARGV[2] is
-- not 1), else the version of the last check (0 when none): the task is
-- claimed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold, full, ttl = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3]
local out = {}
for i, key in ipairs(KEYS) do
  local m = redis.call('HMGET', key, 'v', 'at', 'f', 'x')
  local at = tonumber(m[2]) or 0
  if now - at < hold or (m[3] == '1' and not full) then
    out[i] = -1
  else
    local stamp = string.format('%.0f', now)
    if now - (tonumber(m[4]) or 0) >= ttl / 2 then
      redis.call('HSET', key, 'at', stamp, 'x', stamp)
      redis.call('PEXPIRE', key, ttl)
    else
      redis.call('HSET', key, 'at', stamp)
    end
    out[i] = tonumber(m[1]) or 0
  end
end
return out
