package admission

import (
	"context"
	_ "embed"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/redisx"
)

var (
	//go:embed scripts/bucket.lua
	bucketLua string
	//go:embed scripts/window.lua
	windowLua string
	//go:embed scripts/acquire.lua
	acquireLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/renew.lua
	renewLua string
	//go:embed scripts/reconcile.lua
	reconcileLua string

	bucketScript    = redis.NewScript(bucketLua)
	windowScript    = redis.NewScript(windowLua)
	acquireScript   = redis.NewScript(acquireLua)
	releaseScript   = redis.NewScript(releaseLua)
	renewScript     = redis.NewScript(renewLua)
	reconcileScript = redis.NewScript(reconcileLua)
)

// scriptCall is one script run in a pipeline.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// runPipelined runs calls in one round trip with EVALSHA; the calls Redis
// answered NOSCRIPT (it restarted or was flushed; on Redis Cluster, a node
// that never ran the script, or a replica promoted since) run again with
// EVAL, which also loads the script. Only those run again: on a cluster the
// other calls already ran on nodes that had the script, and a token bucket
// must not give two tokens for one connect. Each call's own error is in its
// cmd; the error returned is a failed round trip, which left calls without
// an answer.
func runPipelined(ctx context.Context, rdb redis.Cmdable, calls []*scriptCall) error {
	if len(calls) == 0 {
		return nil
	}
	exec := func(calls []*scriptCall, sha bool) {
		pipe := rdb.Pipeline()
		for _, c := range calls {
			if sha {
				c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
			} else {
				c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
			}
		}
		pipe.Exec(ctx) // each cmd holds its error
	}
	exec(calls, true)
	var missing []*scriptCall
	for _, c := range calls {
		if redisx.IsNoScript(c.cmd.Err()) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		exec(missing, false)
	}
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && !redisx.IsReply(err) {
			return err
		}
	}
	return nil
}

// ints reads a script's array reply of integers.
func ints(cmd *redis.Cmd, n int) ([]int64, error) {
	vals, err := cmd.Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(vals) < n {
		return nil, errors.New("admission: short script reply")
	}
	return vals, nil
}

// anys is ss as a command's arguments.
func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
