-- append: the stream step shared by setifnewer.lua and announce.lua, which
-- are built as this fragment followed by their own body (see write.go), so
-- the entry's fields and the epoch rule live in one place.
--
-- XADD the change to the tenant's stream, trimmed with MAXLEN ~ maxlen, and
-- keep the stream's epoch key. A stream that does not exist is a new
-- incarnation (first write, or Redis lost it): its first id becomes the
-- epoch, so readers holding ids of the old one notice. A missing epoch key on
-- a live stream is replaced too: readers then see a new epoch and resync,
-- which is always safe. A stream recreated within the millisecond its
-- previous incarnation began would get that incarnation's first id, and so
-- its epoch: it takes the next id instead, so the epoch always changes.
-- Returns the new entry's id.
local function append(stream, epoch, maxlen, task, version, etype, project, user, occurred)
  local fresh = redis.call('EXISTS', stream) == 0
  local function xadd(id)
    return redis.call('XADD', stream, 'MAXLEN', '~', maxlen, id,
      'task_id', task, 'version', version, 'event_type', etype,
      'project_id', project, 'user_id', user, 'occurred_at', occurred)
  end
  local id = xadd('*')
  if fresh then
    local old = redis.call('GET', epoch)
    if old == id then
      local ms, seq = string.match(old, '^(%d+)-(%d+)$')
      redis.call('DEL', stream)
      id = xadd(ms .. '-' .. string.format('%.0f', tonumber(seq) + 1))
    end
    redis.call('SET', epoch, id)
  elseif redis.call('EXISTS', epoch) == 0 then
    redis.call('SET', epoch, id)
  end
  return id
end
