#!/usr/bin/env python3
"""A Task State Service's writer for pushd, in Python.

It moves one task QUEUED -> RUNNING 10 % ... 100 % -> SUCCEEDED with an
output URL. Each state is committed to generation_tasks with a version
guard (a late or repeated write never takes the row back), its fields
beyond the columns in the row's extra, and then published with
POST /v1/publish. With ROW_ONLY=1 it commits the row alone: nodes that run
--read-changes publish it.

Needs psycopg 3 (Debian: python3-psycopg). Settings, from the environment:
DATABASE_URL, PUSHD_URL (http://localhost:8080), PUSHD_API_KEY, TASK_ID,
TENANT_ID, PROJECT_ID, USER_ID, STEP_MS (pause between states, 200),
ROW_ONLY.
"""

import json
import os
import sys
import time
import urllib.request

import psycopg
from psycopg.types.json import Jsonb

UPSERT = """
INSERT INTO generation_tasks (id, tenant_id, project_id, user_id, status, progress, stage, version, updated_at, extra)
VALUES (%(task_id)s, %(tenant_id)s, %(project_id)s, %(user_id)s, %(status)s, %(progress)s, %(stage)s, %(version)s,
        now(), %(extra)s)
ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, progress = EXCLUDED.progress, stage = EXCLUDED.stage,
    version = EXCLUDED.version, updated_at = EXCLUDED.updated_at, extra = EXCLUDED.extra
WHERE generation_tasks.version < EXCLUDED.version AND generation_tasks.tenant_id = EXCLUDED.tenant_id
RETURNING (extract(epoch FROM updated_at) * 1000)::bigint
"""


def states(task):
    """The task's states in order, each one version up."""
    yield dict(task, status="QUEUED", progress=0, stage="queued", extra={})
    for progress in range(10, 101, 10):
        yield dict(task, status="RUNNING", progress=progress, stage="rendering", extra={})
    url = "https://cdn.example/videos/%s.mp4" % task["task_id"]
    yield dict(task, status="SUCCEEDED", progress=100, stage="done", extra={"output_url": url})


def publish(base, key, doc):
    """POST /v1/publish; False when pushd holds that version or a newer one."""
    req = urllib.request.Request(base + "/v1/publish", data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "X-API-Key": key})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)["written"]


def main():
    env = os.environ
    task = {"task_id": env["TASK_ID"], "tenant_id": env["TENANT_ID"],
            "project_id": env.get("PROJECT_ID", ""), "user_id": env.get("USER_ID", "")}
    row_only = env.get("ROW_ONLY") == "1"
    step = int(env.get("STEP_MS", "200")) / 1000
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        for version, state in enumerate(states(task), start=1):
            row = conn.execute(UPSERT, dict(state, version=version, extra=Jsonb(state["extra"]))).fetchone()
            if row is None:
                print("v%d: the row holds this version or a newer one" % version, file=sys.stderr)
                continue
            if not row_only:
                doc = {k: v for k, v in state.items() if k != "extra"}
                doc.update(state["extra"], version=version, updated_at=row[0])
                publish(env.get("PUSHD_URL", "http://localhost:8080"), env.get("PUSHD_API_KEY", ""), doc)
            print("v%d %s %d%%" % (version, state["status"], state["progress"]))
            time.sleep(step)


if __name__ == "__main__":
    main()
