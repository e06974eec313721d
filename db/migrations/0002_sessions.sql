-- Opaque session tokens, the fallback behind session:<token> in the control
-- Redis. The platform's login service owns the rows; pushd only reads them.
-- A row past expires_at (or deleted) is no session: connections that
-- authenticated with it are closed on the next re-validation.
CREATE TABLE IF NOT EXISTS sessions (
    token      text PRIMARY KEY,
    tenant_id  text        NOT NULL,
    user_id    text        NOT NULL,
    plan       text        NOT NULL DEFAULT '',
    expires_at timestamptz
);

CREATE INDEX IF NOT EXISTS sessions_expires_at ON sessions (expires_at);
