// Package converge brings Redis and the hints into agreement with
// PostgreSQL, the truth, for changes nobody announced: a hint is at most
// once, and a writer may die between its steps. It has that one job, done
// by three workers a node with Redis runs, each started and closed by the
// node:
//
//   - Repairer (repair.go; its checks in check.go, check_scope.go and
//     check.lua), the repair rounds: every hub.Config.RepairInterval, at
//     the same instants on every node, the tasks and scopes the hub's
//     connections watch are read from Redis and, one node of the fleet per
//     task or scope and interval (a claim in Redis), checked against
//     PostgreSQL; what PostgreSQL holds newer is published, what a scope's
//     listing finds in Redis is announced again, and what was found is
//     offered to the hub (hub.Hub.OfferChecked), which delivers it. Its
//     bound and cost: docs/DESIGN.md, "Repair: changes never announced".
//   - Reconciler (reconcile.go), on Redis Cluster and split Redis, where a
//     publish writes and announces in two steps: it announces the stored
//     snapshot of a publish that died between the two, from the tenant's
//     unannounced journal. Its bounds: docs/DESIGN.md, "Publishing".
//   - ChangeReader (changes.go), with --read-changes: the fleet's one
//     listener to the rows a Task State Service commits, so a committed
//     row alone reaches the screen, the node that holds the lease storing
//     the snapshot and announcing it as the service's publish would.
//
// The change reader's mechanism is a trigger that NOTIFYs each change of a
// row's version (db/migrations/0006_task_changes.sql): no server setting,
// delivered at commit, and nothing kept while nobody listens. What it can
// lose, changes committed while no reader listened, a reader that takes
// over lists from PostgreSQL (the point its predecessor heard everything
// up to, less a grace for long transactions, at most MaxCatchUp back);
// anything older is left to the repair rounds. Why this mechanism, and
// what each failure costs: docs/DESIGN.md, "Changes read from PostgreSQL".
//
// The store (snapshot/store) lends the rounds its reads: Redis alone
// (Store.ReadRedis), and PostgreSQL in a slot left free by subscribers'
// reads (Store.PostgresSlots, Store.TryQuery). The hub lends what its
// connections watch (Hub.RepairIDs, Hub.RepairScopes) and owns the
// interval, which its resume margin depends on too.
package converge
