-- SetIfNewer: store a snapshot only if it is newer than the stored one and
-- of the same tenant, and announce the change: append it to the tenant's
-- stream and PUBLISH a hint.
--
-- KEYS[1] snapshot key, KEYS[2] negative-cache key, KEYS[3] meta key,
-- KEYS[4] stream key and KEYS[5] stream epoch key (both absent: no stream)
-- ARGV[1] snapshot JSON, ARGV[2] its version, ARGV[3] TTL in milliseconds,
-- ARGV[4] channel to publish on ('' for none), ARGV[5] message,
-- ARGV[6] tenant_id,
-- and with a stream: ARGV[7] MAXLEN (approximate), ARGV[8] task_id,
-- ARGV[9] event_type, ARGV[10] project_id, ARGV[11] user_id,
-- ARGV[12] occurred_at
--
-- append is streamappend.lua's, prepended by write.go.
--
-- Returns 1 when it wrote, 2 when this version is stored already, 0 when a
-- newer one is, 3 when the stored snapshot is another tenant's, 4 when the
-- stored document's version and tenant cannot be read.
-- Only a write appends and publishes: the stream holds one entry per version
-- that actually moved, in the order Redis applied them.
--
-- The meta key holds '<version> <digest> <tenant_id>', the digest being the
-- first 16 hex digits of the document's SHA-1 (enough to notice a rewrite;
-- shorter keeps the value in Redis's compact string encoding), written with
-- the document and the same TTL, so the comparison reads neither the
-- document's JSON nor its depth. A digest that does not match means the
-- document was written by hand (or by an older pushd) since: then the
-- document itself is decoded. One that cannot be decoded, or lacks a
-- numeric version or a tenant_id, refuses every write rather than let an
-- older version in; it is given the TTL of the refused write if it had
-- none, so the task moves again once it expires. Versions are at most
-- 2^53-1 (snapshot.MaxVersion), which Lua numbers (doubles) hold exactly.
local function digest(doc) return string.sub(redis.sha1hex(doc), 1, 16) end

local version, tenant = tonumber(ARGV[2]), ARGV[6]
-- Whatever happens, the task exists, so a negative-cache marker is wrong.
redis.call('DEL', KEYS[2])
local cur = redis.call('GET', KEYS[1])
if cur then
  local stored, owner
  local meta = redis.call('GET', KEYS[3])
  if meta then
    local v, d, t = string.match(meta, '^(%d+) (%x+) (.+)$')
    if v and d == digest(cur) then
      stored, owner = tonumber(v), t
    end
  end
  if not stored then
    local ok, doc = pcall(cjson.decode, cur)
    if ok and type(doc) == 'table' and type(doc.version) == 'number'
        and type(doc.tenant_id) == 'string' then
      stored, owner = doc.version, doc.tenant_id
    end
  end
  if not stored then
    if redis.call('PTTL', KEYS[1]) == -1 then
      redis.call('PEXPIRE', KEYS[1], ARGV[3])
    end
    return 4
  end
  if owner ~= tenant then return 3 end
  if stored == version then return 2 end
  if stored > version then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[3], ARGV[2] .. ' ' .. digest(ARGV[1]) .. ' ' .. tenant, 'PX', ARGV[3])
if #KEYS >= 5 then
  append(KEYS[4], KEYS[5], ARGV[7], ARGV[8], ARGV[2], ARGV[9], ARGV[10], ARGV[11], ARGV[12])
end
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return 1
