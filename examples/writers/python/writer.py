#!/usr/bin/env python3
"""A Task State Service's writer for pushd, in Python.

It moves one task QUEUED -> RUNNING 10 % ... 100 % -> SUCCEEDED with an
output URL. Each state is committed to generation_tasks with a version
guard (a late or repeated write never takes the row back), its fields
beyond the columns in the row's extra, and then published one of three
ways:

- POST /v1/publish (the default): any node stores and announces it, on
  every Redis setup pushd runs on.
- REDIS_URL set: straight to a standalone Redis with redis-py, through
  pushd's write script setifnewer.lua, which stores the snapshot only if
  it is newer, with the TTL of its status, and PUBLISHes the hint in the
  same step (docs/DESIGN.md, "By hand"). On Redis Cluster, or with the
  cache and realtime roles apart, publish through POST /v1/publish
  instead: a write there takes three steps.
- ROW_ONLY=1: the row alone; nodes that run --read-changes publish it.

Needs psycopg 3 (Debian: python3-psycopg) and, with REDIS_URL, redis-py
(python3-redis). Settings, from the environment: DATABASE_URL, PUSHD_URL
(http://localhost:8080), PUSHD_API_KEY, REDIS_URL, KEY_PREFIX (the nodes'
--key-prefix), SETIFNEWER_LUA (the script's path; the repository's by
default), TASK_ID, TENANT_ID, PROJECT_ID, USER_ID, STEP_MS (pause between
states, 200), ROW_ONLY.
"""

import json
import os
import random
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


# The snapshot's TTL in Redis by status, in seconds (docs/DESIGN.md, "TTL
# by status"); any other status is 10 s. Expiry costs a PostgreSQL read,
# never correctness.
TTLS = {"QUEUED": 30, "SUCCEEDED": 3600, "FAILED": 1800, "CANCELED": 1800}

SETIFNEWER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                          "snapshot", "rediswrite", "setifnewer.lua")


class RedisPublisher:
    """Publishes to a standalone Redis as pushd's Go publisher does."""

    def __init__(self, url, prefix, script_path):
        import redis  # only this mode needs redis-py

        self.prefix = prefix
        with open(script_path) as f:
            self.script = redis.Redis.from_url(url).register_script(f.read())

    def publish(self, doc):
        """True when stored and announced; False when pushd holds this
        version or a newer one. Raises on a refused write."""
        task, tenant, version = doc["task_id"], doc["tenant_id"], doc["version"]
        hint = {k: doc[k] for k in ("task_id", "version", "project_id", "user_id", "status") if doc.get(k)}
        hint["occurred_at"] = doc["updated_at"]
        ttl_ms = TTLS.get(doc["status"], 10) * 1000
        ttl_ms += random.randrange(ttl_ms // 10 + 1)  # so snapshots written together expire apart
        reply = self.script(
            keys=[self.prefix + "task:snapshot:" + task, self.prefix + "task:notfound:" + task,
                  self.prefix + "task:snapshot-meta:" + task],
            args=[json.dumps(doc, separators=(",", ":")), version, ttl_ms,
                  self.prefix + "task.changed.{" + tenant + "}", json.dumps(hint, separators=(",", ":")), tenant])
        if reply in (3, 4):
            raise RuntimeError("%s v%d refused: %s" % (task, version,
                               "another tenant's task" if reply == 3 else "the stored snapshot is unreadable"))
        return reply == 1


def main():
    env = os.environ
    task = {"task_id": env["TASK_ID"], "tenant_id": env["TENANT_ID"],
            "project_id": env.get("PROJECT_ID", ""), "user_id": env.get("USER_ID", "")}
    row_only = env.get("ROW_ONLY") == "1"
    step = int(env.get("STEP_MS", "200")) / 1000
    to_redis = None
    if env.get("REDIS_URL") and not row_only:
        to_redis = RedisPublisher(env["REDIS_URL"], env.get("KEY_PREFIX", ""), env.get("SETIFNEWER_LUA", SETIFNEWER))
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        for version, state in enumerate(states(task), start=1):
            row = conn.execute(UPSERT, dict(state, version=version, extra=Jsonb(state["extra"]))).fetchone()
            if row is None:
                print("v%d: the row holds this version or a newer one" % version, file=sys.stderr)
                continue
            if not row_only:
                doc = {k: v for k, v in state.items() if k != "extra"}
                doc.update(state["extra"], version=version, updated_at=row[0])
                if to_redis:
                    to_redis.publish(doc)
                else:
                    publish(env.get("PUSHD_URL", "http://localhost:8080"), env.get("PUSHD_API_KEY", ""), doc)
            print("v%d %s %d%%" % (version, state["status"], state["progress"]))
            time.sleep(step)


if __name__ == "__main__":
    main()
