package stream

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"strconv"
	"strings"
)

// ID is a stream entry id, ms-seq.
type ID struct{ MS, Seq uint64 }

// ParseID reads "ms-seq" as Redis writes it.
func ParseID(s string) (ID, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return ID{}, errors.New("stream id without '-'")
	}
	ms, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return ID{}, err
	}
	seq, err := strconv.ParseUint(b, 10, 64)
	if err != nil {
		return ID{}, err
	}
	return ID{ms, seq}, nil
}

func (id ID) String() string {
	return strconv.FormatUint(id.MS, 10) + "-" + strconv.FormatUint(id.Seq, 10)
}

// IsZero reports whether id is 0-0, before every entry.
func (id ID) IsZero() bool { return id == ID{} }

// Less reports whether id comes before o.
func (id ID) Less(o ID) bool { return id.MS < o.MS || (id.MS == o.MS && id.Seq < o.Seq) }

// cursorPrefix starts every stream cursor: its format version. The cursors
// of the SSE transport's own format ("task=version,...") always contain
// '=', which base64url without padding never does.
const cursorPrefix = "s1."

// maxCursorLen bounds what decodeCursor looks at: 3 + base64 of 4 + 4×10.
const maxCursorLen = 64

// position is where a client or a node is in a tenant's stream: every entry
// up to id of the stream incarnation epoch.
type position struct {
	tag   uint32 // tenantTag of the stream's tenant
	epoch ID
	id    ID
}

// tenantTag binds a cursor to its tenant's stream, so a cursor of another
// tenant is refused (and answered with a full resync) rather than read as a
// position in this tenant's stream. It is not a secret: the tenant always
// comes from the token, and a client forging a cursor can only skip
// updates of its own tenant.
func tenantTag(tenant string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return h.Sum32()
}

var cursorEncoding = base64.RawURLEncoding.Strict()

// IsCursor reports whether s looks like a stream cursor (it may still fail
// to decode): transports hand those to the hub's Stream and parse the rest
// as their own format.
func IsCursor(s string) bool { return strings.HasPrefix(s, cursorPrefix) }

// encodeCursor writes p as "s1." and base64url of: tag (4 bytes, big
// endian), then uvarints of epoch.MS, epoch.Seq, id.MS-epoch.MS, id.Seq. An
// id is never before its epoch, so the delta is small, and a cursor is
// about 25 characters.
func encodeCursor(p position) string {
	var b [4 + 4*binary.MaxVarintLen64]byte
	binary.BigEndian.PutUint32(b[:4], p.tag)
	n := 4
	n += binary.PutUvarint(b[n:], p.epoch.MS)
	n += binary.PutUvarint(b[n:], p.epoch.Seq)
	n += binary.PutUvarint(b[n:], p.id.MS-p.epoch.MS)
	n += binary.PutUvarint(b[n:], p.id.Seq)
	return cursorPrefix + cursorEncoding.EncodeToString(b[:n])
}

var errCorrupt = errors.New("corrupt stream cursor")

// decodeCursor reads what encodeCursor wrote, strictly: the exact prefix,
// canonical base64url, canonical varints, nothing left over, an id not
// before its epoch.
func decodeCursor(s string) (position, error) {
	var p position
	rest, ok := strings.CutPrefix(s, cursorPrefix)
	if !ok || len(s) > maxCursorLen {
		return p, errCorrupt
	}
	for i := 0; i < len(rest); i++ { // the decoder would skip '\r' and '\n'
		if c := rest[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return p, errCorrupt
		}
	}
	b, err := cursorEncoding.DecodeString(rest)
	if err != nil || len(b) < 4+4 {
		return p, errCorrupt
	}
	p.tag = binary.BigEndian.Uint32(b[:4])
	b = b[4:]
	var v [4]uint64
	for i := range v {
		x, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(x) {
			return p, errCorrupt
		}
		v[i], b = x, b[n:]
	}
	if len(b) != 0 || v[2] > ^uint64(0)-v[0] {
		return p, errCorrupt
	}
	p.epoch = ID{v[0], v[1]}
	p.id = ID{v[0] + v[2], v[3]}
	if p.id.Less(p.epoch) {
		return p, errCorrupt
	}
	return p, nil
}

// uvarintLen is the length of x's canonical uvarint: a longer encoding of
// the same value would make two cursors of one position.
func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}
