package wire

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"math"
	"sync"
)

// Opcodes (RFC 6455 5.2).
const (
	opText  = 0x1
	opClose = 0x8
	OpPing  = 0x9
	OpPong  = 0xA
)

// Bits of a frame's first byte.
const (
	finBit  = 0x80
	rsv1Bit = 0x40 // the message is compressed (RFC 7692 6)
)

// MaxControlFrame is a control frame's largest size from a server: a
// 2-byte header and at most 125 bytes of payload (RFC 6455 5.5).
const MaxControlFrame = 2 + 125

// AppendText appends p as one unmasked, uncompressed text frame.
func AppendText(b, p []byte) []byte { return appendFrame(b, finBit|opText, p) }

// AppendDeflated appends a text message compressed by Deflate as one
// frame; only on a connection that negotiated compression (Compressed).
func AppendDeflated(b, deflated []byte) []byte {
	return appendFrame(b, finBit|rsv1Bit|opText, deflated)
}

func appendFrame(b []byte, first byte, p []byte) []byte {
	b = append(b, first)
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
	b = append(b, finBit|op, byte(len(p)))
	return append(b, p...)
}

// deflaters are the compressors Deflate borrows: one is over a megabyte,
// so connections share them rather than keep one each.
var deflaters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestSpeed) // a valid level: no error
	return w
}}

// deflateTail ends a sync flush; RFC 7692 7.2.1 leaves it off the wire.
const deflateTail = "\x00\x00\xff\xff"

// Deflate compresses the text message p as a connection that negotiated
// compression without context takeover reads it: alone, so the result
// serves every such connection. It returns nil when compressing saves
// nothing; send p uncompressed then.
func Deflate(p []byte) []byte {
	var b bytes.Buffer
	b.Grow(len(p))
	w := deflaters.Get().(*flate.Writer)
	w.Reset(&b)
	w.Write(p) // a bytes.Buffer takes every write
	w.Flush()
	deflaters.Put(w)
	out := bytes.TrimSuffix(b.Bytes(), []byte(deflateTail))
	if len(out) >= len(p) {
		return nil
	}
	return bytes.Clone(out) // the buffer's spare capacity is not kept per version
}
