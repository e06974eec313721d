-- Set a task's negative-cache marker, unless its snapshot exists.
--
-- KEYS[1] snapshot key, KEYS[2] negative-cache key; ARGV[1] TTL in ms
--
-- A reader that found no row in PostgreSQL sets the marker after the fact;
-- if the task was created and its snapshot written in between, the marker
-- would hide it for its whole TTL. Checking the snapshot in the same script
-- closes most of that window.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
return 1
