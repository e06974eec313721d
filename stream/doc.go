// Package stream follows the per-tenant Redis Streams of task changes
// (keys.Names.Stream) that publishers append to with XADD MAXLEN ~ (see
// rediswrite.WriteStream), so a node's clients lose nothing that Pub/Sub
// drops:
//
//   - the Tailer XREADs, on a few dedicated connections, the streams of the
//     tenants the node has watchers for, from the last id it applied (never
//     from "$" after the first look), and hands each batch to the hub
//     (hub.Hub.Apply) before it moves on. On Redis Cluster, where one XREAD
//     cannot span slots and each tenant's stream has a slot of its own, each
//     stream has a single-key XREAD BLOCK in flight on its master, up to
//     Config.ClusterReads per master (the rest are polled). While it does so
//     for a tenant, a gap in the tenant's Pub/Sub subscription needs no
//     re-read.
//   - a stream trimmed past that id, or one Redis lost (its epoch changed,
//     it went missing or backwards), is not a gap the stream can close:
//     the tenant is re-read once (hub.Hub.ResyncNow) and tailed afresh.
//   - Position is a compact resume cursor (stream/cursor: epoch, entry id,
//     tenant tag) that any node understands; Replay returns the changes
//     after one, or says why it cannot, and the client is then sent
//     everything.
//
// The tail is a hint source on a par with Pub/Sub, not instead of it:
// Pub/Sub is one hop and wakes the hub at once, the stream is the
// at-least-once backstop and the source of positions. The hub's per
// connection version rule drops whichever copy of a version comes second,
// and the snapshot read for the second is an in-process cache hit.
package stream
