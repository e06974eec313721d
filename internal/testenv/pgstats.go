package testenv

import (
	"context"
	"net/url"
	"testing"
	"time"
)

// AppURL is p.URL with application_name app, so that the backends of a
// pool opened with it can be told apart (FlushStats).
func (p Postgres) AppURL(app string) string {
	u, err := url.Parse(p.URL)
	if err != nil {
		panic("testenv: database URL: " + err.Error())
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

// FlushStats ends every backend of application app and waits until they
// are gone. A backend reports its statistics as it exits, while an idle one
// may hold them for seconds, so TableScans counts everything those
// backends did once this returns. A pool whose backends were ended fails
// its next query on each of them: flush once its work is done.
func (p Postgres) FlushStats(t testing.TB, app string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
		t.Fatalf("testenv: end the backends of %s: %v", app, err)
	}
	for {
		var n int
		if err := p.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatalf("testenv: count the backends of %s: %v", app, err)
		}
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: %d backends of %s still there after 30s", n, app)
		case <-time.After(10 * time.Millisecond): // polling a condition, with a deadline
		}
	}
}

// TableScans is how many scans of table, sequential and by index, the
// statistics count; each query that reads the table by its key is one.
// Counts of backends still running may lag: see FlushStats.
func (p Postgres) TableScans(t testing.TB, table string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	if err := p.Pool.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0)
		FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&n); err != nil {
		t.Fatalf("testenv: scans of %s: %v", table, err)
	}
	return n
}
