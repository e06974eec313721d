-- Give back a connection's slot. Only a lease still present gives back its
-- counts, so a release after the lease expired (and was purged), or a second
-- release, changes nothing.
-- KEYS[1]  the user's count, KEYS[2] the tenant's count, KEYS[3] the leases
-- ARGV[1]  lease member
-- Returns 1 when the lease was there.
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then
  return 0
end
if redis.call('DECR', KEYS[1]) <= 0 then redis.call('DEL', KEYS[1]) end
if redis.call('DECR', KEYS[2]) <= 0 then redis.call('DEL', KEYS[2]) end
return 1
