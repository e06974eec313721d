// Package converge brings Redis and the hints into agreement with
// PostgreSQL, the truth, for changes nobody announced. It has one job,
// done by three workers each node with Redis runs:
//
//   - Repairer (repair.go, check.go, check_scope.go, check.lua): the
//     repair rounds' checks of the tasks and scopes the node's connections
//     watch, against Redis and, one node of the fleet per task or scope and
//     interval (a claim in Redis), against PostgreSQL; what PostgreSQL
//     holds newer is published, what Redis holds is announced again. Its
//     bounds and costs: docs/DESIGN.md, "Repair: changes never announced".
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
package converge
