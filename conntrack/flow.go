package conntrack

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/kpproxy/kp/proxy"
	ct "github.com/ti-mo/conntrack"
)

// IP protocol numbers of the flows kp cares about.
const (
	ProtoTCP  uint8 = proxy.ProtocolNumberTCP
	ProtoUDP  uint8 = proxy.ProtocolNumberUDP
	ProtoSCTP uint8 = proxy.ProtocolNumberSCTP
)

// Flow is one conntrack entry, as kp uses it.
type Flow struct {
	// ID and Zone identify the entry for a delete (an ID that no longer
	// matches means the entry was replaced meanwhile).
	ID       uint32
	Zone     uint16
	Protocol uint8
	// Orig is the original direction as the client sent it: Orig.Dst is
	// the Service address (ClusterIP, node IP + NodePort, …).
	Orig Tuple
	// Reply is the answer's direction as conntrack expects it: after DNAT,
	// Reply.Src is the endpoint.
	Reply Tuple

	Status ct.StatusFlag
	// ProtoState is the TCP or SCTP state number (see State).
	ProtoState uint8
	// Timeout is what is left of the entry's life.
	Timeout time.Duration
	// Start is when the entry was created; zero unless the kernel keeps
	// timestamps (net.netfilter.nf_conntrack_timestamp).
	Start time.Time
	// Counters are zero unless the kernel counts
	// (net.netfilter.nf_conntrack_acct).
	OrigPackets, OrigBytes, ReplyPackets, ReplyBytes uint64
}

// Tuple is one direction of a flow.
type Tuple struct{ Src, Dst netip.AddrPort }

// DNATed reports whether the destination was translated: the answer comes
// from somewhere else than where the client sent to.
func (f Flow) DNATed() bool { return f.Reply.Src != f.Orig.Dst }

// State is the entry's state as conntrack(8) shows it: the TCP or SCTP
// state name, or for UDP and the rest UNREPLIED, REPLIED or ASSURED.
func (f Flow) State() string {
	switch f.Protocol {
	case ProtoTCP:
		if int(f.ProtoState) < len(tcpStates) {
			return tcpStates[f.ProtoState]
		}
		return fmt.Sprintf("TCP_%d", f.ProtoState)
	case ProtoSCTP:
		if int(f.ProtoState) < len(sctpStates) {
			return sctpStates[f.ProtoState]
		}
		return fmt.Sprintf("SCTP_%d", f.ProtoState)
	}
	switch {
	case f.Status&ct.StatusAssured != 0:
		return "ASSURED"
	case f.Status&ct.StatusSeenReply != 0:
		return "REPLIED"
	}
	return "UNREPLIED"
}

// Age is how long ago the entry was created, or 0 when unknown.
func (f Flow) Age(now time.Time) time.Duration {
	if f.Start.IsZero() {
		return 0
	}
	return now.Sub(f.Start)
}

// ProtocolName is the protocol as the Service API spells it.
func (f Flow) ProtocolName() string { return protoName(f.Protocol) }

func protoName(p uint8) string {
	if name := proxy.ProtocolOf(p); name != "" {
		return string(name)
	}
	switch p {
	case 1:
		return "ICMP"
	case 58:
		return "ICMPv6"
	}
	return fmt.Sprintf("proto-%d", p)
}

// tcpSynSent is the kernel's TCP_CONNTRACK_SYN_SENT.
const tcpSynSent = 1

// The kernel's enum tcp_conntrack and enum sctp_conntrack, in order.
var (
	tcpStates = []string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT",
		"LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}
	sctpStates = []string{"NONE", "CLOSED", "COOKIE_WAIT", "COOKIE_ECHOED", "ESTABLISHED",
		"SHUTDOWN_SENT", "SHUTDOWN_RECD", "SHUTDOWN_ACK_SENT", "HEARTBEAT_SENT", "HEARTBEAT_ACKED"}
)

// fromKernel converts ti-mo's flow.
func fromKernel(k ct.Flow) Flow {
	f := Flow{
		ID:       k.ID,
		Zone:     k.Zone,
		Protocol: k.TupleOrig.Proto.Protocol,
		Orig:     tupleOf(k.TupleOrig),
		Reply:    tupleOf(k.TupleReply),
		Status:   k.Status.Value,
		Timeout:  time.Duration(k.Timeout) * time.Second,
		Start:    k.Timestamp.Start,

		OrigPackets: k.CountersOrig.Packets, OrigBytes: k.CountersOrig.Bytes,
		ReplyPackets: k.CountersReply.Packets, ReplyBytes: k.CountersReply.Bytes,
	}
	switch {
	case k.ProtoInfo.TCP != nil:
		f.ProtoState = k.ProtoInfo.TCP.State
	case k.ProtoInfo.SCTP != nil:
		f.ProtoState = k.ProtoInfo.SCTP.State
	}
	return f
}

func tupleOf(t ct.Tuple) Tuple {
	return Tuple{
		Src: netip.AddrPortFrom(t.IP.SourceAddress.Unmap(), t.Proto.SourcePort),
		Dst: netip.AddrPortFrom(t.IP.DestinationAddress.Unmap(), t.Proto.DestinationPort),
	}
}

// toKernel is the minimal flow that identifies f for a delete: the
// original tuple, the zone and the ID.
func toKernel(f Flow) ct.Flow {
	var k ct.Flow
	k.ID = f.ID
	k.Zone = f.Zone
	k.TupleOrig.IP.SourceAddress = f.Orig.Src.Addr()
	k.TupleOrig.IP.DestinationAddress = f.Orig.Dst.Addr()
	k.TupleOrig.Proto.Protocol = f.Protocol
	k.TupleOrig.Proto.SourcePort = f.Orig.Src.Port()
	k.TupleOrig.Proto.DestinationPort = f.Orig.Dst.Port()
	return k
}
