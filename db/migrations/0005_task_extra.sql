-- The fields of a task's snapshot beyond the columns of generation_tasks
-- (a video's output_url, a thumbnail, the prompt): one JSON object the Task
-- State Service writes with the row. A snapshot pushd builds from the row
-- carries its members after the columns, so a field written once stays on
-- screen after Redis loses the snapshot. The check refuses, at the
-- writer's commit, what no snapshot could carry: something other than an
-- object, a member named as a column, or more than 48 KiB of text (the
-- whole document must fit in 64 KiB). It is NOT VALID so adding it scans
-- nothing: rows written before it have the default, '{}'.
ALTER TABLE generation_tasks ADD COLUMN IF NOT EXISTS extra jsonb NOT NULL DEFAULT '{}';
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'generation_tasks_extra_fields'
            AND conrelid = 'generation_tasks'::regclass) THEN
        ALTER TABLE generation_tasks ADD CONSTRAINT generation_tasks_extra_fields CHECK (
            jsonb_typeof(extra) = 'object'
            AND NOT extra ?| ARRAY['task_id', 'tenant_id', 'project_id', 'user_id', 'status', 'progress', 'stage',
                'provider', 'model', 'queue_position', 'preview_asset_id', 'output_asset_id', 'error_code',
                'version', 'updated_at']
            AND octet_length(extra::text) <= 49152
        ) NOT VALID;
    END IF;
END
$$;
