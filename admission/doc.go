// Package admission decides whether a connection or an API call may go
// ahead: connect rate limits per user and per client IP (token buckets),
// per-tenant API limits by plan (sliding windows), and fleet-wide caps on
// open connections per user and per tenant (counts backed by leases that
// the owning node renews).
//
// The limits live in the control Redis and are kept by Lua scripts, one
// atomic step per check. The package works the same on one Redis and on a
// Redis Cluster (a redis.ClusterClient as Config.Redis): every key a
// connection cap touches carries the tenant's hash tag (conn:{<tenant>}:...),
// so each script runs in one slot; each script is given every key it touches
// (a lease's user count key too); the other keys are only ever used alone,
// and pipelines are never transactions.
//
// Each node registers the tenants it holds leases of on every renewal, and
// every node walks the registered tenants, rebuilding from their live
// leases the counts of those it claims first (the reconcile: one node per
// tenant per ReconcileInterval, so its cost does not grow with the node
// count; the users a node saw go to the tenant's shared set, for whichever
// node reconciles it). The registry is spread over 64 sets (tenantBuckets), a
// tenant's picked by FNV-1a of its id, so no one key takes every node's
// registrations and on a cluster the sets land on several shards. The
// reconcile walks them one at a time, spread over ReconcileInterval, from
// a random one. For one release it also reads the single set of the
// release before, which nodes not upgraded yet still write: it reconciles
// those tenants, moves the ones with live leases to their sets and removes
// them all from it.
//
// When Redis does not answer within Config.Timeout, the node decides on
// local limits instead (golang.org/x/time/rate buckets, and caps of the
// fleet's caps divided by Config.ExpectedNodes), counts it, and tries Redis
// again after Config.RetryAfterFailure. Without Redis (the embedded mode)
// the local limits are the only ones.
//
// Redis keys (every one behind Config.Prefix; where a key names two ids, or
// an id in a hash tag, each id is spelled with keys.Join, so that ids
// holding ':' or braces never make two principals share a key):
//
//	rl:conn:user:<tenant>:<user>        connect bucket of a user (hash tokens, ts)
//	rl:conn:ip:<ip>                     connect bucket of a client IP
//	rl:api:tenant:<tenant>:<endpoint>   API window (sorted set of request times)
//	tenant:<tenant>                     tenant configuration (hash; field plan)
//	conn:{<tenant>}:user:<user>         open connections of a user
//	conn:{<tenant>}:tenant              open connections of a tenant
//	conn:{<tenant>}:leases              leases (sorted set, member <id>:<user>, score expiry ms)
//	conn:{<tenant>}:reconciled          the tenant's reconcile claim (string, PX 0.9 ReconcileInterval)
//	conn:{<tenant>}:seen                users seen since the last reconcile, lease or none (set)
//	conn:tenants:{<0-63>}               tenants with leases, for the reconcile (set; FNV-1a of the id mod 64)
//	conn:tenants                        the same, of the release before: read and drained, never written
package admission
