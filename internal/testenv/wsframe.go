package testenv

import "encoding/binary"

// WSClientFrame is a WebSocket frame as a client sends it (masked, with a
// fixed key), for tests that speak the protocol by hand: op is the
// opcode, fin ends the message, and p is at most 65,535 bytes.
func WSClientFrame(fin bool, op byte, p []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	mask := [4]byte{1, 2, 3, 4}
	b := []byte{b0}
	switch n := len(p); {
	case n <= 125:
		b = append(b, 0x80|byte(n))
	default:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	}
	b = append(b, mask[:]...)
	for i, c := range p {
		b = append(b, c^mask[i%4])
	}
	return b
}
