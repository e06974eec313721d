// A Task State Service's writer for pushd, in Node.js.
//
// It moves one task QUEUED -> RUNNING 10 % ... 100 % -> SUCCEEDED with an
// output URL. Each state is committed to generation_tasks with a version
// guard (a late or repeated write never takes the row back), its fields
// beyond the columns in the row's extra, and then published with
// POST /v1/publish. With ROW_ONLY=1 it commits the row alone: nodes that
// run --read-changes publish it.
//
// Needs Node.js 18 or later and pg from npm (npm install). Settings, from
// the environment: DATABASE_URL, PUSHD_URL (http://localhost:8080),
// PUSHD_API_KEY, TASK_ID, TENANT_ID, PROJECT_ID, USER_ID, STEP_MS (pause
// between states, 200), ROW_ONLY.

import pg from 'pg';

const UPSERT = `
INSERT INTO generation_tasks (id, tenant_id, project_id, user_id, status, progress, stage, version, updated_at, extra)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), $9)
ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, progress = EXCLUDED.progress, stage = EXCLUDED.stage,
    version = EXCLUDED.version, updated_at = EXCLUDED.updated_at, extra = EXCLUDED.extra
WHERE generation_tasks.version < EXCLUDED.version AND generation_tasks.tenant_id = EXCLUDED.tenant_id
RETURNING (extract(epoch FROM updated_at) * 1000)::bigint AS updated_at`;

// states yields the task's states in order, each one version up.
function* states(task) {
  yield { ...task, status: 'QUEUED', progress: 0, stage: 'queued', extra: {} };
  for (let progress = 10; progress <= 100; progress += 10) {
    yield { ...task, status: 'RUNNING', progress, stage: 'rendering', extra: {} };
  }
  const url = `https://cdn.example/videos/${task.task_id}.mp4`;
  yield { ...task, status: 'SUCCEEDED', progress: 100, stage: 'done', extra: { output_url: url } };
}

// publish posts a snapshot; false when pushd holds that version or a newer one.
async function publish(base, key, doc) {
  const resp = await fetch(`${base}/v1/publish`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-API-Key': key },
    body: JSON.stringify(doc),
    signal: AbortSignal.timeout(10000),
  });
  if (!resp.ok) throw new Error(`POST /v1/publish: ${resp.status} ${await resp.text()}`);
  return (await resp.json()).written;
}

const env = process.env;
const task = {
  task_id: env.TASK_ID, tenant_id: env.TENANT_ID, project_id: env.PROJECT_ID ?? '', user_id: env.USER_ID ?? '',
};
const rowOnly = env.ROW_ONLY === '1';
const step = Number(env.STEP_MS ?? '200');
const client = new pg.Client({ connectionString: env.DATABASE_URL });
await client.connect();
try {
  let version = 0;
  for (const state of states(task)) {
    version++;
    const { rows } = await client.query(UPSERT, [state.task_id, state.tenant_id, state.project_id, state.user_id,
      state.status, state.progress, state.stage, version, state.extra]);
    if (rows.length === 0) {
      console.error(`v${version}: the row holds this version or a newer one`);
      continue;
    }
    if (!rowOnly) {
      const { extra, ...doc } = state;
      await publish(env.PUSHD_URL ?? 'http://localhost:8080', env.PUSHD_API_KEY ?? '',
        { ...doc, ...extra, version, updated_at: Number(rows[0].updated_at) });
    }
    console.log(`v${version} ${state.status} ${state.progress}%`);
    await new Promise((resolve) => setTimeout(resolve, step));
  }
} finally {
  await client.end();
}
