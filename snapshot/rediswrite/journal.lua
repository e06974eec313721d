-- Journal: the first step of a write on Redis Cluster or on split Redis,
-- before the snapshot write: record the publish as pending in the tenant's
-- unannounced journal, a sorted set in the tenant's slot.
--
-- KEYS[1] the tenant's unannounced journal
-- ARGV[1] member ('<task_id> <version>'), ARGV[2] score (the publisher's
-- Unix ms), ARGV[3] the journal's TTL in milliseconds
--
-- A member already present (a retry of the same version, by this publisher
-- or another) gets a score above its old one even when the clocks disagree,
-- so whoever read the old score never removes it (forget.lua). Returns the
-- score set.
local score = tonumber(ARGV[2])
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if cur and tonumber(cur) >= score then
  score = tonumber(cur) + 1
end
redis.call('ZADD', KEYS[1], score, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return score
