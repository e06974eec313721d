-- SetIfNewer: store a snapshot only if it is newer than the stored one.
--
-- KEYS[1] snapshot key, KEYS[2] negative-cache key
-- ARGV[1] snapshot JSON, ARGV[2] its version, ARGV[3] TTL in milliseconds,
-- ARGV[4] channel to publish on ('' for none), ARGV[5] message
--
-- Returns 1 when it wrote, 0 when the stored version is the same or newer.
-- A stored document that does not decode, or has no numeric version, is
-- overwritten: Redis is a cache and PostgreSQL holds the truth. Versions
-- compare as Lua numbers (doubles), exact up to 2^53.
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if ok and type(doc) == 'table' and type(doc.version) == 'number'
      and doc.version >= tonumber(ARGV[2]) then
    -- The task exists either way, so a negative-cache marker is wrong.
    redis.call('DEL', KEYS[2])
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return 1
