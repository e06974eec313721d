-- Announce: the second step of a write on Redis Cluster, in the tenant's
-- slot, after WriteIfNewer stored (or found stored) the snapshot in the
-- task's: append the change to the tenant's stream and SPUBLISH the hint on
-- the tenant's shard channel, whose hash tag is the stream's, so one script
-- may do both.
--
-- KEYS[1] stream key, KEYS[2] stream epoch key
-- ARGV[1] shard channel, ARGV[2] message, ARGV[3] MAXLEN (approximate),
-- ARGV[4] task_id, ARGV[5] version, ARGV[6] event_type, ARGV[7] project_id,
-- ARGV[8] user_id, ARGV[9] occurred_at,
-- ARGV[10] how many of the newest entries to search for this version's
-- entry before appending: 0 when the snapshot write just stored it (no
-- earlier call can have appended it), else a retry's window
--
-- append is streamappend.lua's, prepended by write.go.
--
-- Returns 1 when it appended, 0 when the window already held an entry of
-- this task at this version or newer (an earlier call's, whose reply was
-- lost). Either way it publishes: a retry exists to reach the watchers.
local appended = 1
local window = tonumber(ARGV[10])
if window > 0 then
  local v = tonumber(ARGV[5])
  for _, e in ipairs(redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', window)) do
    local f, task, version = e[2], nil, nil
    for i = 1, #f, 2 do
      if f[i] == 'task_id' then task = f[i + 1] elseif f[i] == 'version' then version = tonumber(f[i + 1]) end
    end
    if task == ARGV[4] and version and version >= v then
      appended = 0
      break
    end
  end
end
if appended == 1 then
  append(KEYS[1], KEYS[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
end
redis.call('SPUBLISH', ARGV[1], ARGV[2])
return appended
