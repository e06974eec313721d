-- What pushd's change reader (--read-changes) needs, so that a Task State
-- Service may commit the row alone and leave the snapshot and the hint to
-- pushd. Without that mode nothing listens, and each NOTIFY costs a
-- writer's commit little: delivered to no one, it is dropped.
--
-- The trigger announces every committed change of a task's version on the
-- channel pushd_task_changes; the payload is the task's id and version.
-- PostgreSQL delivers it at commit to whoever listens then. A row written
-- again at the same version is not announced: pushd orders by the version,
-- and such a row has nothing a client could be shown.
CREATE OR REPLACE FUNCTION pushd_task_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.version IS DISTINCT FROM OLD.version THEN
        PERFORM pg_notify('pushd_task_changes', NEW.id || ' ' || NEW.version);
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER pushd_task_changed AFTER INSERT OR UPDATE ON generation_tasks
    FOR EACH ROW EXECUTE FUNCTION pushd_task_changed();

-- The reader that takes over after another, or starts after none listened,
-- lists what changed since the last one heard everything: a range of
-- updated_at.
CREATE INDEX IF NOT EXISTS generation_tasks_updated ON generation_tasks (updated_at, id);
