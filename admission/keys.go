package admission

// names builds the package's Redis keys behind a prefix.
type names struct{ prefix string }

// User ids are unique within a tenant only, so a user's bucket names both.
func (n names) connUser(tenant, user string) string {
	return n.prefix + "rl:conn:user:" + tenant + ":" + user
}
func (n names) connIP(ip string) string { return n.prefix + "rl:conn:ip:" + ip }
func (n names) api(tenant, endpoint string) string {
	return n.prefix + "rl:api:tenant:" + tenant + ":" + endpoint
}
func (n names) tenantConfig(tenant string) string { return n.prefix + "tenant:" + tenant }

// The braces are a Redis Cluster hash tag: a tenant's counts and leases
// share one slot, so one script can take both counts together.
func (n names) capUserPrefix(tenant string) string {
	return n.prefix + "conn:{" + tenant + "}:user:"
}
func (n names) capUser(tenant, user string) string { return n.capUserPrefix(tenant) + user }
func (n names) capTenant(tenant string) string     { return n.prefix + "conn:{" + tenant + "}:tenant" }
func (n names) leases(tenant string) string        { return n.prefix + "conn:{" + tenant + "}:leases" }
func (n names) tenants() string                    { return n.prefix + "conn:tenants" }
