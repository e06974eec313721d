package converge

import (
	"context"
	_ "embed"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/keys"
)

//go:embed lease.lua
var leaseLua string

var leaseScript = redis.NewScript(leaseLua)

// lease is the fleet's lease on a job one node runs at a time, with a
// fencing token: a holder that lost it (its node froze past the TTL) finds
// out at its next renewal, and what it writes with its token is refused
// once another holds the lease.
type lease struct {
	rdb        redis.UniversalClient
	key, state string
	node       string
	ttl        time.Duration
}

func newLease(rdb redis.UniversalClient, names keys.Names, node string, ttl time.Duration) *lease {
	return &lease{rdb: rdb, key: names.ChangeReader(), state: names.ChangeReaders(), node: node, ttl: ttl}
}

// acquire takes the lease when no one holds it: its token, and the point
// up to which a holder heard every change (zero for none). held is false
// when another holds it.
func (l *lease) acquire(ctx context.Context) (token int64, heard time.Time, held bool, err error) {
	v, err := leaseScript.Run(ctx, l.rdb, []string{l.key, l.state}, "acquire", l.node, l.ttl.Milliseconds()).Slice()
	if errors.Is(err, redis.Nil) {
		return 0, time.Time{}, false, nil
	}
	if err != nil || len(v) != 2 {
		return 0, time.Time{}, false, errors.Join(errors.New("lease: acquire"), err)
	}
	token, _ = v[0].(int64)
	if s, _ := v[1].(string); s != "" {
		us, err := strconv.ParseInt(s, 10, 64)
		if err == nil {
			heard = time.UnixMicro(us)
		}
	}
	return token, heard, true, nil
}

// errLeaseLost: another holds the lease now.
var errLeaseLost = errors.New("lease: lost to another node")

// renew extends the lease held with token and records heard (unless
// zero) as the point up to which every change was heard.
func (l *lease) renew(ctx context.Context, token int64, heard time.Time) error {
	point := ""
	if !heard.IsZero() {
		point = strconv.FormatInt(heard.UnixMicro(), 10)
	}
	ok, err := leaseScript.Run(ctx, l.rdb, []string{l.key, l.state}, "renew", token, l.ttl.Milliseconds(), point).Int()
	switch {
	case err != nil:
		return err
	case ok != 1:
		return errLeaseLost
	}
	return nil
}

// release gives the lease up, so another node takes it at once.
func (l *lease) release(ctx context.Context, token int64) error {
	return leaseScript.Run(ctx, l.rdb, []string{l.key, l.state}, "release", token).Err()
}
