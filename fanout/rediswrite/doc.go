// Package rediswrite is the Lua write protocol on Redis: the scripts that
// store a snapshot only if it is newer (SET), announce it (PUBLISH) and
// append it to the tenant's stream (XADD), as one atomic step.
//
// It is its own small package, beside the fanout publisher, because two
// writers must speak exactly the same protocol: the publisher and the read
// store's write-back (snapshot/store). Putting it in fanout would make the
// store import the Pub/Sub bus; putting it in the store would make a Task
// State Service that only publishes import the read path.
//
// A Task State Service that publishes through fanout.NewRedisPublisher does
// not need it; one that writes Redis by hand calls these functions so it speaks the same protocol.
package rediswrite
