-- The table the Task State Service owns and pushd reads. pushd never writes it,
-- except for the demo's simulator (--demo), which plays that service.
CREATE TABLE IF NOT EXISTS generation_tasks (
    id               text PRIMARY KEY,
    tenant_id        text        NOT NULL,
    project_id       text        NOT NULL DEFAULT '',
    user_id          text        NOT NULL DEFAULT '',
    status           text        NOT NULL,
    progress         integer     NOT NULL DEFAULT 0,
    stage            text,
    provider         text,
    model            text,
    queue_position   integer,
    preview_asset_id text,
    output_asset_id  text,
    error_code       text,
    version          bigint      NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS generation_tasks_tenant_project ON generation_tasks (tenant_id, project_id);
CREATE INDEX IF NOT EXISTS generation_tasks_tenant_user ON generation_tasks (tenant_id, user_id);
