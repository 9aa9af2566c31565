package nft

// An element's key as kp keeps it (keyID: the key's bytes and whether it
// ends an interval), and its spelling for logs.

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
)

// keyID identifies an element in its set: its raw key, after a byte that
// says whether it is an interval's end.
func keyID(k []byte, end bool) string {
	flag := byte(0)
	if end {
		flag = 1
	}
	return string(append([]byte{flag}, k...))
}

func keyBytes(id string) []byte { return []byte(id[1:]) }

func isEndKey(id string) bool { return id != "" && id[0] == 1 }

// keyIDText spells a key kp only knows by its bytes (what it read back
// from the kernel), for logs: hex, "/end" for an interval's end.
func keyIDText(id string) string {
	if isEndKey(id) {
		return hex.EncodeToString(keyBytes(id)) + "/end"
	}
	return hex.EncodeToString(keyBytes(id))
}

// keyTextOf spells the key of an element of one of kp's sets the way nft
// lists it, from the key's bytes alone: kp keeps only the keys of what it
// wrote (see footprint), and prints the elements it deletes. Keys it cannot
// place are printed in hex.
func keyTextOf(set, id string) string {
	k := keyBytes(id)
	addr := func(b []byte) (string, bool) {
		a, ok := netip.AddrFromSlice(b)
		return a.String(), ok && (len(b) == 4 || len(b) == 16)
	}
	// "proto . port" as kp pads it: protocol, 3 bytes, port, 2 bytes.
	protoPort := func(b []byte) (string, bool) {
		if len(b) != 8 {
			return "", false
		}
		return keyText(protoName(b[0]), fmt.Sprint(binary.BigEndian.Uint16(b[4:6]))), true
	}
	switch set {
	case mapEndpoints:
		if len(k) == 4 {
			return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(k))
		}
	case setHairpin:
		a, ok1 := addr(k[:len(k)/2])
		b, ok2 := addr(k[len(k)/2:])
		if ok1 && ok2 {
			return keyText(a, b)
		}
	case mapServiceNodePorts, mapNoEndpointNodePorts:
		if s, ok := protoPort(k); ok {
			return s
		}
	case mapServiceIPs, mapNoEndpointServices, mapFirewallIPs:
		if len(k) > 8 {
			a, ok1 := addr(k[:len(k)-8])
			p, ok2 := protoPort(k[len(k)-8:])
			if ok1 && ok2 {
				return keyText(a, p)
			}
		}
	default: // sets of addresses (interval sets among them)
		if a, ok := addr(k); ok {
			if isEndKey(id) {
				return a + " (end)"
			}
			return a
		}
	}
	return keyIDText(id)
}
