package admission

import "github.com/pushd/pushd/keys"

// names builds the package's Redis keys behind a prefix. A key that names
// two ids, or an id in a hash tag, spells them with keys.Join, so no two
// principals share a key however their ids are spelled.
type names struct{ prefix string }

// User ids are unique within a tenant only, so a user's bucket names both.
func (n names) connUser(tenant, user string) string {
	return n.prefix + "rl:conn:user:" + keys.Join(tenant, user)
}
func (n names) connIP(ip string) string { return n.prefix + "rl:conn:ip:" + ip }
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
func (n names) tenants() string                { return n.prefix + "conn:tenants" }
func (n names) conn(tenant string) string      { return n.prefix + "conn:{" + keys.Join(tenant) + "}" }

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
