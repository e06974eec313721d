-- Indexes for reads by scope in the order of changes: the repair's listing
-- of what changed lately in a watched project or user (updated_at after a
-- point), and the subscriptions' listings of a scope's newest tasks
-- (ORDER BY updated_at DESC), each one range scan. They replace the
-- (tenant_id, project_id) and (tenant_id, user_id) indexes, their prefixes.
-- On a large table in production create them CONCURRENTLY first
-- (docs/DEPLOYMENT.md, "The repair's cost").
CREATE INDEX IF NOT EXISTS generation_tasks_tenant_project_updated ON generation_tasks (tenant_id, project_id, updated_at);
CREATE INDEX IF NOT EXISTS generation_tasks_tenant_user_updated ON generation_tasks (tenant_id, user_id, updated_at);
DROP INDEX IF EXISTS generation_tasks_tenant_project;
DROP INDEX IF EXISTS generation_tasks_tenant_user;
