// Package rediswrite is the Lua write protocol on Redis: the scripts that
// store a snapshot only if it is newer (SET), announce it (PUBLISH) and
// append it to the tenant's stream (XADD), as one atomic step.
//
// It is its own small package, under the snapshot model and below both
// writers, because they must speak exactly the same protocol: the
// publisher (fanout) and the read store's write-back (snapshot/store).
// Putting it in fanout would make the store import the Pub/Sub bus;
// putting it in the store would make a Task State Service that only
// publishes import the read path. fanout/rediswrite, its former path,
// hands the same names on.
//
// A Task State Service that publishes through fanout.NewRedisPublisher does
// not need it; one that writes Redis by hand calls these functions so it speaks the same protocol.
package rediswrite
