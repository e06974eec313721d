-- SetIfNewer: store a snapshot only if it is newer than the stored one, and
-- announce the change: append it to the tenant's stream and PUBLISH a hint.
--
-- KEYS[1] snapshot key, KEYS[2] negative-cache key,
-- KEYS[3] stream key and KEYS[4] stream epoch key (both absent: no stream)
-- ARGV[1] snapshot JSON, ARGV[2] its version, ARGV[3] TTL in milliseconds,
-- ARGV[4] channel to publish on ('' for none), ARGV[5] message,
-- and with a stream: ARGV[6] MAXLEN (approximate), ARGV[7] task_id,
-- ARGV[8] event_type, ARGV[9] project_id, ARGV[10] user_id,
-- ARGV[11] occurred_at
--
-- Returns 1 when it wrote, 2 when this version is stored already, 0 when a
-- newer one is.
-- Only a write appends and publishes: the stream holds one entry per version
-- that actually moved, in the order Redis applied them. A stored document
-- that does not decode, or has no numeric version, is overwritten: Redis is
-- a cache and PostgreSQL holds the truth. Versions compare as Lua numbers
-- (doubles), exact up to 2^53.
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if ok and type(doc) == 'table' and type(doc.version) == 'number'
      and doc.version >= tonumber(ARGV[2]) then
    -- The task exists either way, so a negative-cache marker is wrong.
    redis.call('DEL', KEYS[2])
    if doc.version == tonumber(ARGV[2]) then return 2 end
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
if #KEYS >= 4 then
  -- A stream that does not exist is a new incarnation (first write, or
  -- Redis lost it): its first id becomes the epoch, so readers holding ids
  -- of the old one notice. A missing epoch key on a live stream is replaced
  -- too: readers then see a new epoch and resync, which is always safe.
  local fresh = redis.call('EXISTS', KEYS[3]) == 0
  local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*',
    'task_id', ARGV[7], 'version', ARGV[2], 'event_type', ARGV[8],
    'project_id', ARGV[9], 'user_id', ARGV[10], 'occurred_at', ARGV[11])
  if fresh or redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('SET', KEYS[4], id)
  end
end
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return 1
