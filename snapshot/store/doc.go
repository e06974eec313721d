// Package store reads task snapshots from Redis, falling back to PostgreSQL,
// the source of truth: an in-process cache, singleflight per task, a
// negative cache and a bounded PostgreSQL fallback whose results are written
// back to Redis. It writes through the Lua protocol of snapshot/rediswrite, so
// a write-back never replaces a newer version a publisher stored meanwhile.
package store
