package nft

import (
	"context"
	"maps"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// loopbackEndpoints brings the test namespace's lo up with the /32s addrs
// (ClusterIPs and endpoint addresses: such a test has no other link) and
// serves each of endpoints ("ip:port"), counting the connections it
// accepts and closing them.
func loopbackEndpoints(t *testing.T, ns string, addrs, endpoints []string) *accepted {
	t.Helper()
	cmds := [][]string{{"link", "set", "lo", "up"}}
	for _, a := range addrs {
		cmds = append(cmds, []string{"addr", "add", a + "/32", "dev", "lo"})
	}
	for _, args := range cmds {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	acc := &accepted{n: map[string]int{}}
	for _, a := range endpoints {
		netns.Serve(t, ns, a, func(net.Conn) {
			acc.mu.Lock()
			acc.n[a]++
			acc.mu.Unlock()
		})
	}
	return acc
}

// accepted counts connections by the endpoint that accepted them.
type accepted struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *accepted) counts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.n)
}

// await polls the counts until done holds of them, for up to 5 s, and
// returns the last counts.
func (a *accepted) await(done func(map[string]int) bool) map[string]int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := a.counts()
		if done(got) || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dialN opens and closes n connections to addr from inside ns.
func dialN(t *testing.T, ns, addr string, n int) {
	t.Helper()
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := netns.DialConn(ctx, ns, "tcp", addr)
		cancel()
		if err != nil {
			t.Fatalf("connect to %s: %v", addr, err)
		}
		c.Close()
	}
}
