package admission

import (
	"hash/fnv"
	"strconv"

	"github.com/pushd/pushd/keys"
)

// names builds the package's Redis keys behind a prefix. A key that names
// two ids, or an id in a hash tag, spells them with keys.Join, so no two
// principals share a key however their ids are spelled.
type names struct{ prefix string }

// User ids are unique within a tenant only, so a user's bucket names both.
func (n names) connUser(tenant, user string) string {
	return n.prefix + "rl:conn:user:" + keys.Join(tenant, user)
}
func (n names) connIP(ip string) string { return n.prefix + "rl:conn:ip:" + ip }
func (n names) pollUser(tenant, user string) string {
	return n.prefix + "rl:poll:user:" + keys.Join(tenant, user)
}
func (n names) api(tenant, endpoint string) string {
	return n.prefix + "rl:api:tenant:" + keys.Join(tenant, endpoint)
}
func (n names) tenantConfig(tenant string) string { return n.prefix + "tenant:" + tenant }

// The braces are a Redis Cluster hash tag: a tenant's counts and leases
// share one slot, so one script can take both counts together. The scripts
// find a lease's count key as capUserPrefix followed by the lease member's
// user part, which leaseMember spells the same way.
func (n names) capUserPrefix(tenant string) string { return n.conn(tenant) + ":user:" }
func (n names) capUser(tenant, user string) string {
	return n.capUserPrefix(tenant) + keys.Join(user)
}
func (n names) capTenant(tenant string) string { return n.conn(tenant) + ":tenant" }
func (n names) leases(tenant string) string    { return n.conn(tenant) + ":leases" }

// reconciled is a tenant's reconcile claim: set by the node that
// reconciles it, for most of a ReconcileInterval.
func (n names) reconciled(tenant string) string { return n.conn(tenant) + ":reconciled" }

// seenUsers is the users whose counts the tenant's next reconcile checks
// even without a lease: those that held one on some node since.
func (n names) seenUsers(tenant string) string { return n.conn(tenant) + ":seen" }
func (n names) conn(tenant string) string      { return n.prefix + "conn:{" + keys.Join(tenant) + "}" }

// tenantBuckets is how many sets the registry of tenants with leases is
// spread over, so no one key takes every node's registrations, and on a
// Redis Cluster the sets land on several shards. Every node must name a
// tenant's set alike, so it is a constant, not a setting.
const tenantBuckets = 64

// tenantBucket is the registry set of a tenant: FNV-1a (32 bits) of its
// id, modulo tenantBuckets.
func tenantBucket(tenant string) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % tenantBuckets)
}

// tenants is registry set b. The braces are a hash tag: each set is a slot
// of its own, used alone.
func (n names) tenants(b int) string {
	return n.prefix + "conn:tenants:{" + strconv.Itoa(b) + "}"
}

// legacyTenants is the one registry set of the release before the
// buckets, which nodes of that release still write while a fleet upgrades:
// the reconcile reads it and moves its tenants to their buckets.
func (n names) legacyTenants() string { return n.prefix + "conn:tenants" }

// leaseMember is the member of a lease in its tenant's sorted set:
// <16 hex>:<user>, the user spelled as in its count key.
func leaseMember(id, user string) string { return keys.Join(id, user) }

// leaseUser is the user of a lease member.
func leaseUser(member string) string {
	ids, err := keys.Split(member)
	if err != nil || len(ids) != 2 {
		return ""
	}
	return ids[1]
}

// localBucket names a bucket of the local limits.
func localBucket(kind string, ids ...string) string { return kind + ":" + keys.Join(ids...) }
