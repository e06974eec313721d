package snapshot

import "fmt"

// MaxIDLen bounds task, tenant, project and user ids. Ids reach Redis key
// names and log lines, so they are kept short and plain.
const MaxIDLen = 128

// ValidID reports whether id may name a task, tenant, project or user: 1 to
// MaxIDLen bytes of ASCII letters, digits, '_', '-', '.' and ':'. Braces,
// spaces and control bytes never reach a Redis key or channel name.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > MaxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '_', c == '-', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// CheckMany validates the ids of a GetMany before any I/O: at most MaxMany,
// each valid.
func CheckMany(ids []string) error {
	if len(ids) > MaxMany {
		return fmt.Errorf("get many: %d ids, at most %d: %w", len(ids), MaxMany, ErrInvalidID)
	}
	for _, id := range ids {
		if !ValidID(id) {
			return ErrInvalidID
		}
	}
	return nil
}
