package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// ListAffinity implements proxy.AffinityLister: with ClientIP affinity
// each KP-SEP- chain's DNAT rule records the client in the recent module's
// list named after the chain (-m recent --name KP-SEP-... --set), and the
// policy chain sends a client listed there within the timeout back to it
// (--rcheck --seconds). The lists are /proc/net/xt_recent/<name> of the
// namespace the rules are in, which is the calling thread's (as for the
// runners). An entry's time is the kernel's jiffies (kernelClock).
func (b *Backend) ListAffinity(ctx context.Context, s *proxy.State) ([]proxy.AffinityEntry, error) {
	var clk *jiffiesClock
	var out []proxy.AffinityEntry
	for _, f := range b.programmed() {
		for name, sp := range s.Services {
			if sp.AffinityTimeout <= 0 {
				continue
			}
			for _, e := range proxy.FilterEndpoints(f, s.Endpoints[name]) {
				if err := ctx.Err(); err != nil {
					return out, err
				}
				list := sepChainName(sp, e)
				data, err := os.ReadFile(recentDir + list)
				if errors.Is(err, fs.ErrNotExist) {
					continue // no rule has set it yet
				}
				if err != nil {
					return out, fmt.Errorf("read the recent list of %s: %w", list, err)
				}
				if clk == nil {
					if clk, err = kernelClock(); err != nil {
						return out, fmt.Errorf("the recent lists' timestamps: %w", err)
					}
				}
				recent, err := parseRecent(data)
				if err != nil {
					return out, fmt.Errorf("%s%s: %w", recentDir, list, err)
				}
				// The policy chain's --rcheck --seconds takes whole seconds.
				timeout := time.Duration(int(sp.AffinityTimeout.Seconds())) * time.Second
				for _, r := range recent {
					if left := timeout - clk.since(r.lastSeen); left > 0 {
						out = append(out, proxy.AffinityEntry{ServicePort: name, Client: r.src, Endpoint: e.AddrPort(), Expires: left})
					}
				}
			}
		}
	}
	return out, nil
}

// recentDir holds the recent module's lists of the calling thread's
// network namespace (/proc/net is the process's, not the thread's).
const recentDir = "/proc/thread-self/net/xt_recent/"

// recentEntry is one line of a recent list: a source and when (jiffies) it
// was last seen.
type recentEntry struct {
	src      netip.Addr
	lastSeen uint64
}

// parseRecent reads a recent list:
// "src=10.0.0.5 ttl: 64 last_seen: 4297368273 oldest_pkt: 1 4297368273".
func parseRecent(data []byte) ([]recentEntry, error) {
	var out []recentEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		src, ok := strings.CutPrefix(f[0], "src=")
		var seen string
		for i := 1; i+1 < len(f); i++ {
			if f[i] == "last_seen:" {
				seen = f[i+1]
			}
		}
		a, err := netip.ParseAddr(src)
		if !ok || err != nil || seen == "" {
			return nil, fmt.Errorf("line %d %q: not src=ADDR ... last_seen: JIFFIES", n, sc.Text())
		}
		j, err := strconv.ParseUint(seen, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: last_seen: %w", n, err)
		}
		out = append(out, recentEntry{src: a.Unmap(), lastSeen: j})
	}
	return out, sc.Err()
}

// jiffiesClock is the kernel's jiffies now and its tick rate.
type jiffiesClock struct {
	now uint64
	hz  uint64
}

func (c *jiffiesClock) since(j uint64) time.Duration {
	if j > c.now {
		return 0
	}
	return time.Duration(float64(c.now-j) / float64(c.hz) * float64(time.Second))
}

// kernelClock reads jiffies from /proc/timer_list (root only; the machine's
// clock, not a namespace's).
func kernelClock() (*jiffiesClock, error) {
	data, err := os.ReadFile("/proc/timer_list")
	if err != nil {
		return nil, err
	}
	return parseTimerList(data)
}

// parseTimerList takes jiffies and the monotonic time ("now at N nsecs")
// from /proc/timer_list and tells HZ from them: the kernel starts jiffies
// 5 minutes before wrapping 32 bits (INITIAL_JIFFIES = -300*HZ as an
// unsigned 32-bit value), so jiffies - 2^32 = HZ * (uptime - 300 s). HZ is
// the nearest of the kernel's CONFIG_HZ choices, within 2%.
func parseTimerList(data []byte) (*jiffiesClock, error) {
	var nowNS, jiffies uint64
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() && (nowNS == 0 || jiffies == 0) {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "now at "); ok && nowNS == 0 {
			nowNS, _ = strconv.ParseUint(strings.TrimSuffix(v, " nsecs"), 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "jiffies: "); ok && jiffies == 0 {
			jiffies, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	if nowNS == 0 || jiffies == 0 {
		return nil, errors.New("/proc/timer_list: no \"now at\" or \"jiffies:\" line")
	}
	up := float64(nowNS)/1e9 - 300
	if up < 60 || jiffies < 1<<32 {
		return nil, errors.New("the machine has been up too short a time to tell the kernel's HZ from jiffies")
	}
	est := float64(jiffies-1<<32) / up
	for _, hz := range []uint64{100, 250, 300, 1000} {
		if math.Abs(est-float64(hz)) < float64(hz)/50 {
			return &jiffiesClock{now: jiffies, hz: hz}, nil
		}
	}
	return nil, fmt.Errorf("jiffies %d at %d ns of uptime give HZ %.1f, not one of 100, 250, 300, 1000", jiffies, nowNS, est)
}
