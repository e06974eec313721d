-- The change reader's lease (keys.Names.ChangeReader), one holder per
-- fleet. KEYS[1] is the lease, a hash of token and node; KEYS[2] the
-- readers' state, a hash of token (the last one given) and heard (Unix
-- microseconds by PostgreSQL's clock up to which a reader heard every
-- change). ARGV[1] is the operation:
--
-- acquire, node, ttl_ms: when no one holds the lease, takes it with the
--   next token and replies {token, heard} ('' for none); else false.
-- renew, token, ttl_ms, heard: when token holds the lease, extends it and
--   raises heard to the given point unless it is '' or lower; replies 1,
--   else 0 (the lease was lost: the holder stops).
-- release, token: when token holds the lease, deletes it; replies 1, else 0.
local op = ARGV[1]
if op == 'acquire' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return false
  end
  local token = redis.call('HINCRBY', KEYS[2], 'token', 1)
  redis.call('HSET', KEYS[1], 'token', token, 'node', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {token, redis.call('HGET', KEYS[2], 'heard') or ''}
end
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then
  return 0
end
if op == 'renew' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  if ARGV[4] ~= '' then
    local old = tonumber(redis.call('HGET', KEYS[2], 'heard') or '0') or 0
    if tonumber(ARGV[4]) > old then
      redis.call('HSET', KEYS[2], 'heard', ARGV[4])
    end
  end
  return 1
end
if op == 'release' then
  redis.call('DEL', KEYS[1])
  return 1
end
return redis.error_reply('lease: unknown operation ' .. tostring(op))
