-- forget: the journal step shared by announce.lua and forget.lua, which are
-- built as this fragment followed by their own body (see write.go).
--
-- Removes member from a tenant's unannounced journal only if its score is
-- not newer than since, the score its remover read or set. A later journal
-- step of the same member always raises its score (journal.lua), so a
-- publish or a reconcile that finishes with an entry never removes the one
-- of a publish still in flight. Returns 1 when it removed the member.
local function forget(journal, member, since)
  local score = redis.call('ZSCORE', journal, member)
  if score and tonumber(score) <= tonumber(since) then
    redis.call('ZREM', journal, member)
    return 1
  end
  return 0
end
