package wire

import (
	"encoding/binary"
	"math"
)

// Opcodes (RFC 6455 5.2).
const (
	opText  = 0x1
	opClose = 0x8
	OpPing  = 0x9
	OpPong  = 0xA
)

// MaxControlFrame is a control frame's largest size from a server: a
// 2-byte header and at most 125 bytes of payload (RFC 6455 5.5).
const MaxControlFrame = 2 + 125

// AppendText appends p as one unmasked, uncompressed text frame: what a
// server sends when no extension was negotiated (Accept negotiates none).
func AppendText(b, p []byte) []byte {
	b = append(b, 0x80|opText)
	switch n := len(p); {
	case n <= 125:
		b = append(b, byte(n))
	case n <= math.MaxUint16:
		b = append(b, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, p...)
}

// AppendControl appends a server's control frame of opcode op (OpPing or
// OpPong) carrying p, at most 125 bytes.
func AppendControl(b []byte, op byte, p []byte) []byte {
	b = append(b, 0x80|op, byte(len(p)))
	return append(b, p...)
}
