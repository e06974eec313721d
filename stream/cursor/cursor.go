// Package cursor is the format of stream resume cursors: a position in a
// tenant's Redis Stream, encoded as "s1." and base64url. It is a leaf of its
// own so a transport can tell a stream cursor from its own format without
// linking the stream reader and its Redis driver.
package cursor

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

// prefix starts every stream cursor: its format version. The cursors
// of the SSE transport's own format ("task=version,...") always contain
// '=', which base64url without padding never does.
const prefix = "s1."

// maxLen bounds what Decode looks at: 3 + base64 of 4 + 4×10.
const maxLen = 64

// Position is where a client or a node is in a tenant's stream: every entry
// up to id of the stream incarnation epoch.
type Position struct {
	Tag   uint32 // TenantTag of the stream's tenant
	Epoch ID
	ID    ID
}

// TenantTag binds a cursor to its tenant's stream, so a cursor of another
// tenant is refused (and answered with a full resync) rather than read as a
// position in this tenant's stream. It is not a secret: the tenant always
// comes from the token, and a client forging a cursor can only skip
// updates of its own tenant.
func TenantTag(tenant string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return h.Sum32()
}

var cursorEncoding = base64.RawURLEncoding.Strict()

// Is reports whether s looks like a stream cursor (it may still fail
// to decode): transports hand those to the hub's Stream and parse the rest
// as their own format.
func Is(s string) bool { return strings.HasPrefix(s, prefix) }

// Encode writes p as "s1." and base64url of: tag (4 bytes, big
// endian), then uvarints of epoch.MS, epoch.Seq, id.MS-epoch.MS, id.Seq. An
// id is never before its epoch, so the delta is small, and a cursor is
// about 25 characters.
func Encode(p Position) string {
	var b [4 + 4*binary.MaxVarintLen64]byte
	binary.BigEndian.PutUint32(b[:4], p.Tag)
	n := 4
	n += binary.PutUvarint(b[n:], p.Epoch.MS)
	n += binary.PutUvarint(b[n:], p.Epoch.Seq)
	n += binary.PutUvarint(b[n:], p.ID.MS-p.Epoch.MS)
	n += binary.PutUvarint(b[n:], p.ID.Seq)
	return prefix + cursorEncoding.EncodeToString(b[:n])
}

// ErrCorrupt is what Decode returns for anything Encode did not write.
var ErrCorrupt = errors.New("corrupt stream cursor")

// Decode reads what Encode wrote, strictly: the exact prefix,
// canonical base64url, canonical varints, nothing left over, an id not
// before its epoch.
func Decode(s string) (Position, error) {
	var p Position
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || len(s) > maxLen {
		return p, ErrCorrupt
	}
	for i := 0; i < len(rest); i++ { // the decoder would skip '\r' and '\n'
		if c := rest[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return p, ErrCorrupt
		}
	}
	b, err := cursorEncoding.DecodeString(rest)
	if err != nil || len(b) < 4+4 {
		return p, ErrCorrupt
	}
	p.Tag = binary.BigEndian.Uint32(b[:4])
	b = b[4:]
	var v [4]uint64
	for i := range v {
		x, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(x) {
			return p, ErrCorrupt
		}
		v[i], b = x, b[n:]
	}
	if len(b) != 0 || v[2] > ^uint64(0)-v[0] {
		return p, ErrCorrupt
	}
	p.Epoch = ID{v[0], v[1]}
	p.ID = ID{v[0] + v[2], v[3]}
	if p.ID.Less(p.Epoch) {
		return p, ErrCorrupt
	}
	return p, nil
}

// uvarintLen is the length of x's canonical uvarint: a longer encoding of
// the same value would make two cursors of one position.
func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}
