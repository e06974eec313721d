package rediswrite

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// JournalTTL is how long a tenant's unannounced journal lives after its
// last journal step: long past any reconcile, and short enough that the
// journal of a tenant nobody publishes to any more goes away.
const JournalTTL = time.Hour

// Pending is one publish's entry in its tenant's unannounced journal
// (keys.Names.Unannounced): a sorted set whose members are
// "<task_id> <version>" and whose scores are the Unix ms of the journal
// step. An entry says "this version of this task may be stored and not yet
// announced"; the publish's announcement removes it, and so does a node's
// reconcile once it announced the stored version or found it was never
// stored.
//
// The zero Pending names no entry: Announce then removes nothing.
type Pending struct {
	TaskID  string
	Version int64
	Since   int64 // the entry's score, Unix ms, as Journal set it or a reader read it
}

// Member is the entry's member in the journal.
func (p Pending) Member() string { return p.TaskID + " " + strconv.FormatInt(p.Version, 10) }

// ParsePending reads a journal member and its score; false for a member
// that is not "<task_id> <version>".
func ParsePending(member string, score float64) (Pending, bool) {
	task, v, ok := strings.Cut(member, " ")
	version, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil || !snapshot.ValidID(task) || version <= 0 {
		return Pending{}, false
	}
	return Pending{TaskID: task, Version: version, Since: int64(score)}, true
}

// Journal is the first of the three steps of a write on Redis Cluster, or
// with the cache and realtime roles on two Redis servers: before the
// snapshot write (WriteIfNewer), it records s's publish in the tenant's
// unannounced journal, scored with the publisher's clock, and sets the
// journal's TTL to JournalTTL. One script in the tenant's slot (on split
// Redis, on the realtime Redis); an entry already there for this version
// (a retry) gets a higher score. The Pending it returns is what the third
// step (Announce) or, for a stale or refused write, Forget removes.
func Journal(ctx context.Context, rdb redis.Scripter, names keys.Names, s *snapshot.Snapshot) (Pending, error) {
	p := Pending{TaskID: s.TaskID, Version: s.Version}
	since, err := journalScript.Run(ctx, rdb, []string{names.Unannounced(s.TenantID)},
		p.Member(), time.Now().UnixMilli(), JournalTTL.Milliseconds()).Int64()
	if err != nil {
		return Pending{}, fmt.Errorf("snapshot journal %s: %w", s.TaskID, err)
	}
	p.Since = since
	return p, nil
}

// Forget removes p from tenant's unannounced journal unless a later
// journal step of the same version raised its score past p.Since: for a
// write found stale or refused, which is never announced, and for a
// reconcile that found p's version was never stored. It reports whether it
// removed the entry.
func Forget(ctx context.Context, rdb redis.Scripter, names keys.Names, tenant string, p Pending) (bool, error) {
	n, err := forgetScript.Run(ctx, rdb, []string{names.Unannounced(tenant)}, p.Member(), p.Since).Int64()
	if err != nil {
		return false, fmt.Errorf("snapshot journal %s: %w", p.TaskID, err)
	}
	return n == 1, nil
}

// Announcement is what Announce announces.
type Announcement struct {
	// Snapshot is the stored snapshot announced. Required.
	Snapshot *snapshot.Snapshot
	// Outcome is WriteIfNewer's: Written or Current, never Stale. A
	// reconcile announcing a stored version passes Current.
	Outcome Outcome
	// Pending is the journal entry the announcement removes (under
	// Forget's rule); the zero Pending removes nothing.
	Pending Pending
	// Channel and Message are the hint: Message published on Channel, the
	// tenant's (keys.Names.Channel) or one that shares its hash tag.
	Channel string
	Message []byte
	// StreamMaxLen > 0 also appends the change to the tenant's stream,
	// trimmed with MAXLEN ~ StreamMaxLen; zero appends nothing.
	StreamMaxLen int64
}

// announceWindow is how many of a stream's newest entries Announce searches
// for an earlier call's entry of the same version before it appends a
// version found Current.
const announceWindow = 100

var errAnnounceStale = errors.New("snapshot announce: a stale version is never announced")

// Announce is the last step of a write on Redis Cluster, or on split Redis
// (the realtime Redis), after Journal and WriteIfNewer: one script in the
// tenant's slot removes a.Pending from the tenant's unannounced journal,
// with a stream appends the change to the tenant's stream
// (keys.Names.Stream, the fields and epoch rule of WriteStream), and
// publishes the hint: SPUBLISH with keys.Names.Cluster, else PUBLISH.
//
// A Written version always appends. A Current one is a retry after a
// failed announcement, a second publisher of the same version, or a
// reconcile: it appends only when none of the stream's newest
// announceWindow entries is of this task at this version or newer, so a
// retry whose first announcement did reach Redis (its reply was lost) adds
// no duplicate, and one that did not still leaves the entry resume cursors
// need. Past the window a duplicate may be appended: entries are hints
// keyed by task and version, and a reader drops a version it delivered
// already. It reports whether it appended.
func Announce(ctx context.Context, rdb redis.Scripter, names keys.Names, a Announcement) (appended bool, err error) {
	s := a.Snapshot
	switch {
	case s == nil || len(s.JSON()) == 0:
		return false, errors.New("snapshot announce: empty snapshot")
	case a.Outcome != Written && a.Outcome != Current:
		return false, errAnnounceStale
	}
	publish, member := "PUBLISH", ""
	if names.Cluster {
		publish = "SPUBLISH"
	}
	if a.Pending.TaskID != "" {
		member = a.Pending.Member()
	}
	ks := []string{names.Unannounced(s.TenantID)}
	args := []any{publish, a.Channel, a.Message, member, a.Pending.Since}
	if a.StreamMaxLen > 0 {
		window := 0
		if a.Outcome == Current {
			window = announceWindow
		}
		ks = append(ks, names.Stream(s.TenantID), names.StreamEpoch(s.TenantID))
		args = append(args, a.StreamMaxLen, s.TaskID, strconv.FormatInt(s.Version, 10), EventChanged, s.ProjectID, s.UserID, s.UpdatedAt, window)
	}
	n, err := announceScript.Run(ctx, rdb, ks, args...).Int64()
	if err != nil {
		return false, fmt.Errorf("snapshot announce %s: %w", s.TaskID, err)
	}
	return n == 1, nil
}
