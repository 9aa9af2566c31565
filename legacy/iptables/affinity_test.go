package iptables

import (
	"strings"
	"testing"
	"time"
)

func TestParseRecentReadsSourcesAndLastSeen(t *testing.T) {
	got, err := parseRecent([]byte("src=10.0.0.5 ttl: 64 last_seen: 4297368273 oldest_pkt: 1 4297368273\n" +
		"src=fd00::1 ttl: 0 last_seen: 4297368000 oldest_pkt: 2 4297367000, 4297368000\n"))
	if err != nil || len(got) != 2 || got[0].src.String() != "10.0.0.5" || got[0].lastSeen != 4297368273 || got[1].src.String() != "fd00::1" {
		t.Fatalf("%+v, %v", got, err)
	}
	if _, err := parseRecent([]byte("garbage\n")); err == nil {
		t.Error("a line that is no entry is accepted")
	}
}

func TestParseTimerListTellsHZ(t *testing.T) {
	// 45232.87 s up at HZ 250: jiffies = 2^32 + 250 * (45232.87 - 300).
	c, err := parseTimerList([]byte("Timer List Version: v0.10\nnow at 45232872624620 nsecs\n\ncpu: 0\njiffies: 4306200514\n"))
	if err != nil || c.hz != 250 || c.now != 4306200514 {
		t.Fatalf("%+v, %v; want HZ 250", c, err)
	}
	if d := c.since(c.now - 2500); d != 10*time.Second {
		t.Errorf("2500 jiffies ago is %v, want 10s", d)
	}
	if _, err := parseTimerList([]byte("now at 400000000000 nsecs\njiffies: 4294967296\n")); err == nil || !strings.Contains(err.Error(), "HZ") {
		t.Errorf("jiffies that give no HZ: %v", err)
	}
}
