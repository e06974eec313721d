-- Forget: remove a journal entry whose snapshot will not be announced (a
-- stale or refused write, or a reconcile that found the version never
-- stored), under forget's rule.
--
-- KEYS[1] the tenant's unannounced journal
-- ARGV[1] member ('<task_id> <version>'), ARGV[2] since (Unix ms)
return forget(KEYS[1], ARGV[1], ARGV[2])
