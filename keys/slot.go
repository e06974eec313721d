package keys

import (
	"strings"
	"sync"
)

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag, the text between the first '{' and the next '}' when that is
// not empty, else of the whole key, modulo 16384.
func slot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16(key) % slotCount)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), Redis
// Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// tagAlphabet spells slot tags: letters and digits, no brace, and enough of
// them that tags of three characters cover every slot.
const tagAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

var (
	slotTagsOnce sync.Once
	slotTags     [slotCount]string
)

// slotTag returns the shortest string of tagAlphabet whose hash slot is s
// (0 ≤ s < 16384), the first in length-then-alphabet order among those of
// that length: the same on every node, so a name built on it is too. The
// table is built on first use by enumerating strings of length 1, 2, 3 ...
// until every slot has one.
func slotTag(s int) string {
	slotTagsOnce.Do(func() {
		left := slotCount
		for n := 1; left > 0; n++ {
			buf := make([]byte, n)
			for i := range buf {
				buf[i] = tagAlphabet[0]
			}
			for left > 0 {
				if t := string(buf); slotTags[crc16(t)%slotCount] == "" {
					slotTags[crc16(t)%slotCount] = t
					left--
				}
				if !nextTag(buf) {
					break
				}
			}
		}
	})
	return slotTags[s]
}

// nextTag advances buf to the next string of its length in alphabet order,
// reporting false once it wrapped around.
func nextTag(buf []byte) bool {
	for i := len(buf) - 1; i >= 0; i-- {
		k := strings.IndexByte(tagAlphabet, buf[i])
		if k+1 < len(tagAlphabet) {
			buf[i] = tagAlphabet[k+1]
			return true
		}
		buf[i] = tagAlphabet[0]
	}
	return false
}
