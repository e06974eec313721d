-- What a session may see inside its tenant besides its user's own tasks,
-- as a token's projects claim: project ids, or '{*}' for every project.
-- The default, none, is the narrow grant: the user's own tasks only.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS projects text[] NOT NULL DEFAULT '{}';
