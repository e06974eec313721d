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
-- append is streamappend.lua's, prepended by write.go.
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
  append(KEYS[3], KEYS[4], ARGV[6], ARGV[7], ARGV[2], ARGV[8], ARGV[9], ARGV[10], ARGV[11])
end
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return 1
