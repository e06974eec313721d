-- Announce: the last step of a write on Redis Cluster or on split Redis, in
-- the tenant's slot, after WriteIfNewer stored (or found stored) the
-- snapshot in the task's: remove the publish's entry from the tenant's
-- unannounced journal, with streams append the change to the tenant's
-- stream, and publish the hint on the tenant's channel. The journal, the
-- stream and the channel share the hash tag {<tenant_id>}, so one script may
-- do all three.
--
-- KEYS[1] unannounced journal, KEYS[2] stream key and KEYS[3] stream epoch
-- key (both absent: no stream)
-- ARGV[1] the publish command (PUBLISH, or SPUBLISH on a cluster),
-- ARGV[2] channel, ARGV[3] message, ARGV[4] journal member ('' for none),
-- ARGV[5] the member's since,
-- and with a stream: ARGV[6] MAXLEN (approximate), ARGV[7] task_id,
-- ARGV[8] version, ARGV[9] event_type, ARGV[10] project_id,
-- ARGV[11] user_id, ARGV[12] occurred_at, ARGV[13] how many of the newest
-- entries to search for this version's entry before appending: 0 when the
-- snapshot write just stored it (no earlier call can have appended it),
-- else a retry's window
--
-- append is streamappend.lua's and forget forget.lua's, prepended by
-- write.go.
--
-- Returns 1 when it appended, 0 when it did not (no stream, or the window
-- already held an entry of this task at this version or newer: an earlier
-- call's, whose reply was lost). Either way it publishes: a retry exists to
-- reach the watchers.
if ARGV[4] ~= '' then
  forget(KEYS[1], ARGV[4], ARGV[5])
end
local appended = 0
if #KEYS >= 3 then
  appended = 1
  local window = tonumber(ARGV[13])
  if window > 0 then
    local v = tonumber(ARGV[8])
    for _, e in ipairs(redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', window)) do
      local f, task, version = e[2], nil, nil
      for i = 1, #f, 2 do
        if f[i] == 'task_id' then task = f[i + 1] elseif f[i] == 'version' then version = tonumber(f[i + 1]) end
      end
      if task == ARGV[7] and version and version >= v then
        appended = 0
        break
      end
    end
  end
  if appended == 1 then
    append(KEYS[2], KEYS[3], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12])
  end
end
redis.call(ARGV[1], ARGV[2], ARGV[3])
return appended
