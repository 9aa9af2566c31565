package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// A tour is kp started in its first mode and switched, with kp migrate
// node, through the rest in order: each step one ordered pair of modes
// (a hop), or a pair kp refuses by design, asked for and refused while the
// mode stays.
type tour struct {
	name  string // the subtest: host-N on the host, ipvs-N in the VM
	start mode
	steps []tourStep
	// olderNAT: iptables-nft's nat chains exist before kp starts, as
	// kubelet's and CNI plugins' do on a real node, so they run after
	// kp's nftables chains: a switch to iptables-nft is shadowed until
	// kp's nftables rules go.
	olderNAT bool
	// noNode: kp's manifests hold no Node object, so kp takes the node's
	// addresses from the kernel (as a kp does that starts before its Node
	// is known), and a switched mode must take them the same way.
	noNode bool
}

type tourStep struct {
	to      mode
	refused bool
}

func hop(m mode) tourStep    { return tourStep{to: m} }
func refuse(m mode) tourStep { return tourStep{to: m, refused: true} }

// refusedFlavorSwitch is what kp says of a switch between the iptables
// flavors (migrate.Switcher.Request).
const refusedFlavorSwitch = "kp cannot run both iptables flavors at once; switch to nftables first"

// hostTours cover every ordered pair of the modes the host's kernel offers
// (nftables, iptables-nft, iptables-legacy, userspace) once: an Eulerian
// circuit of that graph (nftables → iptables-nft → userspace →
// iptables-legacy → nftables → userspace → nftables → iptables-legacy →
// userspace → iptables-nft → nftables) cut into three tours, each its own
// world, run in parallel; and the two pairs refused by design.
var hostTours = []tour{
	{name: "host-1", start: modeNFTables, olderNAT: true, steps: []tourStep{hop(modeIPTablesNFT), refuse(modeIPTablesLegacy),
		hop(modeUserspace), hop(modeIPTablesLegacy), refuse(modeIPTablesNFT)}},
	{name: "host-2", start: modeIPTablesLegacy, noNode: true, steps: []tourStep{hop(modeNFTables), hop(modeUserspace), hop(modeNFTables)}},
	{name: "host-3", start: modeNFTables, steps: []tourStep{hop(modeIPTablesLegacy), hop(modeUserspace), hop(modeIPTablesNFT), hop(modeNFTables)}},
}

// ipvsTours cover every ordered pair with the ipvs mode, from and to it
// (nftables → ipvs → iptables-legacy → ipvs → userspace, userspace → ipvs
// → iptables-nft → ipvs → nftables): on the VM's kernel, which has IPVS
// (TestIPVSMigrationsInTheVM). The ipvs mode writes its chains in the
// iptables flavor that already holds rules (kp's flags name none), so
// coming from iptables-legacy it may choose legacy; expectOnly takes
// either.
var ipvsTours = []tour{
	{name: "ipvs-1", start: modeNFTables, steps: []tourStep{hop(modeIPVS), hop(modeIPTablesLegacy), hop(modeIPVS), hop(modeUserspace)}},
	{name: "ipvs-2", start: modeUserspace, steps: []tourStep{hop(modeIPVS), hop(modeIPTablesNFT), hop(modeIPVS), hop(modeNFTables)}},
}

// hops are the tour's steps' subtests, in order: "FROM-to-TO", or
// "FROM-to-TO-refused".
func (tr tour) hops() []string {
	var out []string
	cur := tr.start
	for _, s := range tr.steps {
		if s.refused {
			out = append(out, cur.name+"-to-"+s.to.name+"-refused")
			continue
		}
		out = append(out, cur.name+"-to-"+s.to.name)
		cur = s.to
	}
	return out
}

func (tr tour) ipvs() bool {
	if tr.start.ipvs {
		return true
	}
	for _, s := range tr.steps {
		if s.to.ipvs {
			return true
		}
	}
	return false
}

// kp migrate node switches a running kp between every ordered pair of
// modes while traffic runs through each switch: new connections from a
// pod to two ClusterIPs and from an off-node client to a NodePort, a
// long-lived connection and a UDP flow, all started in the mode switched
// from; the endpoints of one Service change in the middle of each switch.
// No new connection fails, the flow loses nothing, the long-lived
// connection keeps its endpoint, the new mode serves the new endpoints,
// and afterwards the node holds only the target mode's rules (every
// backend: nftables, both iptables flavors and families, IPVS, ipsets, the
// dummy link). The switches kp refuses by design are refused with their
// reason, and change nothing.
func TestMigrateNodeEveryOrderedPairOfModesDropsNothing(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save")
	t.Parallel()
	for _, tr := range append(slices.Clone(hostTours), ipvsTours...) {
		t.Run(tr.name, func(t *testing.T) {
			if !tr.ipvs() && os.Getenv("KP_VM") == "1" && os.Getenv("KP_VM_E2E") != "all" {
				t.Skip("proven on the host (KP_VM_E2E=all runs it on the VM's kernel too)")
			}
			for _, s := range tr.steps {
				skipUnselected(t, s.to)
			}
			if tr.ipvs() {
				requireIPVS(t)
				netns.Require(t, "ipvsadm", "ipset")
			}
			w := newTourWorld(t, tr)
			start := time.Now()
			cur := tr.start
			for i, s := range tr.steps {
				name := tr.hops()[i]
				if s.refused {
					t.Run(name, func(t *testing.T) { w.refused(t, cur, s.to) })
					continue
				}
				if !t.Run(name, func(t *testing.T) { w.hop(t, i, cur, s.to) }) && w.running(t) != s.to.proxyMode {
					t.Fatalf("the tour stops: kp does not run %s after the failed hop", s.to.name)
				}
				cur = s.to
			}
			t.Logf("the tour's %d steps took %v", len(tr.steps), time.Since(start).Round(100*time.Millisecond))
		})
	}
}

// tourWorld is a tour's world: kp, the pods behind its Services, and the
// Service whose endpoints each switch changes.
type tourWorld struct {
	e      *env
	pods   []*netns.Pod
	client *netns.Pod // a pod that is no endpoint: the ClusterIP loop's
	api    Service
	lastID uint64 // the last migration a hop followed
}

// The tour's NodePort (web's TCP port) on the node's address.
const tourNodePort = 30080

func newTourWorld(t *testing.T, tr tour) *tourWorld {
	w := prepareTourWorld(t, tr)
	w.e.startKP()
	w.ready(tr.start)
	return w
}

// prepareTourWorld builds the tour's world, with kp not started yet.
func prepareTourWorld(t *testing.T, tr tour) *tourWorld {
	start := tr.start
	if tr.ipvs() {
		// The UDP flow's virtual server stays while IPVS tracks the flow:
		// until this long after its last packet.
		start.args = append(slices.Clone(start.args), "--ipvs-udp-timeout", "10s")
	}
	// Four pods (each costs seconds in the VM): web's three endpoints, of
	// which api has two; the fourth serves the long-lived connection and
	// is the ClusterIP loop's client, no endpoint of web's or api's.
	e := newEnv(t, start, 4)
	vmShare(t)
	w := &tourWorld{e: e, pods: e.w.Pods()}
	w.client = w.pods[3]
	streamServer(t, w.pods[3])
	webSvc := web(w.pods[0], w.pods[1], w.pods[2])
	webSvc.Type = v1.ServiceTypeNodePort
	webSvc.Ports[0].NodePort, webSvc.Ports[1].NodePort = tourNodePort, tourNodePort
	w.api = Service{Name: "api", ClusterIPs: []string{"10.96.0.11"},
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(w.pods[2], w.pods[0])}
	e.write("web.yaml", webSvc)
	e.write("api.yaml", w.api)
	e.write("stream.yaml", Service{Name: "stream", ClusterIPs: []string{"10.96.0.12"},
		Ports: []Port{{Name: "s", Port: 9000, TargetPort: 9090}}, Endpoints: endpoints(w.pods[3])})
	if tr.noNode {
		if err := e.dir.Remove("node.yaml"); err != nil {
			t.Fatal(err)
		}
	}
	if tr.olderNAT {
		// Rules that match nothing (TEST-NET-1), in the chains the verify
		// probes (OUTPUT) and the clients (PREROUTING) pass.
		for _, chain := range []string{"PREROUTING", "OUTPUT"} {
			if out, err := e.w.Exec(e.w.Node(), "iptables-nft", "-t", "nat", "-A", chain, "-d", "192.0.2.1/32", "-j", "RETURN"); err != nil {
				t.Fatalf("an older iptables-nft nat chain: %v\n%s", err, out)
			}
		}
	}
	return w
}

// ready waits until kp, started in mode m, serves the tour's Services.
func (w *tourWorld) ready(m mode) {
	e := w.e
	for _, a := range []string{webTCP, apiTCP} {
		e.answers(w.client.NS, "tcp", a)
	}
	e.answers(w.client.NS, "udp", webUDP)
	e.answers(e.w.Client(), "tcp", w.nodePort())
	e.expectOnly(m.name)
}

func (w *tourWorld) nodePort() string { return hostPort(w.e.w.NodeIP().String(), tourNodePort) }

// traffic starts a hop's traffic: from the pod that is no endpoint new
// connections to web's and api's ClusterIPs and the UDP flow to web's;
// from the off-node client new connections to web's NodePort and the
// long-lived connection to stream's ClusterIP.
func (w *tourWorld) traffic(t *testing.T) *traffic {
	client := w.e.w.Client()
	tr := startFlows(t, flows{
		loops: []loopFlow{
			{name: "from " + w.client.Name + " to ClusterIPs", ns: w.client.NS, addrs: []string{webTCP, apiTCP}},
			{name: "from off the node to the NodePort", ns: client, addrs: []string{w.nodePort()}},
		},
		stream:  flowTo{client, streamTCP},
		udp:     flowTo{w.client.NS, webUDP},
		capture: w.e.w.Node(),
	})
	tr.flowing(5)
	return tr
}

// at is the tour's env for subtest t (its helpers fail t, not the tour).
func (w *tourWorld) at(t *testing.T) *env {
	e := *w.e
	e.t = t
	return &e
}

// hop switches kp from one mode to another (the tour's i-th step) under
// the hop's own traffic, changing api's endpoints while the switch runs.
func (w *tourWorld) hop(t *testing.T, i int, from, to mode) {
	e := w.at(t)
	// In the VM each run of kp migrate node costs tens of seconds under
	// emulation: the dry run and the re-run that finds nothing to do are
	// the host's (the switch's own run already fails on anything stale
	// after it).
	inVM := os.Getenv("KP_VM") == "1"
	if i == 0 && !inVM {
		// The plan alone changes nothing.
		out := e.migrate("--to", to.name, "--dry-run")
		for _, want := range []string{"Plan (to " + to.name + ")", "3. remove", "Dry run: nothing changed."} {
			if !strings.Contains(out, want) {
				t.Errorf("dry run output lacks %q:\n%s", want, out)
			}
		}
		e.expectOnly(from.name)
	}
	tr := w.traffic(t)
	// Another two of the three at each step (the step before had i-1 or
	// i-2).
	apiPods := []*netns.Pod{w.pods[i%3], w.pods[(i+1)%3]}
	w.api.Endpoints = endpoints(apiPods...)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() { out, err := e.tryMigrate("--to", to.name); done <- result{out, err} }()
	// The endpoints change while the switch runs: once kp took it on.
	w.lastID = w.switchTaken(t, w.lastID)
	e.write("api.yaml", w.api)
	res := <-done
	if res.err != nil {
		t.Fatalf("kp migrate node --to %s: %v\n%s\nkp's log:\n%s", to.name, res.err, res.out, tail(e.kp.Log(), 60))
	}
	t.Logf("kp migrate node --to %s:\n%s", to.name, res.out)
	if from.ipvs {
		// IPVS drops the packets of a connection whose virtual server is
		// gone: the long-lived connection's and the UDP flow's stay until
		// they end, the rest goes.
		e.ipvsKeptOnly(streamTCP, webUDP)
	} else {
		e.expectOnly(to.name)
	}
	if _, body, err := netns.HTTPGet(e.w.Node(), "http://"+metricsAddr+"/proxyMode", 2*time.Second); err != nil || body != to.proxyMode {
		t.Errorf("/proxyMode says %q (%v), want %s", body, err, to.proxyMode)
	}
	// The change made during the switch lands with the next sync, in the
	// new mode.
	e.onlyFrom(w.client.NS, apiTCP, apiPods...)
	if !from.ipvs && !inVM {
		e.nothingToDo(to.name)
	}
	tr.flowing(5)
	tr.stop("")
	if from.ipvs {
		e.eventually("the ipvs mode's last virtual server removed once its connections ended", time.Minute,
			func() error { return noIPVSState(e.w) })
		e.expectOnly(to.name)
		if !inVM {
			e.nothingToDo(to.name)
		}
	}
}

// refused asks for a switch kp refuses by design, under traffic: the
// command fails with the reason, and nothing changes.
func (w *tourWorld) refused(t *testing.T, cur, to mode) {
	e := w.at(t)
	tr := w.traffic(t)
	out, err := e.tryMigrate("--to", to.name)
	if err == nil || !strings.Contains(out, refusedFlavorSwitch) || !strings.Contains(out, "step request") {
		t.Errorf("kp migrate node --to %s from %s: %v, want it refused (%q):\n%s", to.name, cur.name, err, refusedFlavorSwitch, out)
	} else {
		t.Logf("kp migrate node --to %s from %s, refused: %s", to.name, cur.name, strings.TrimSpace(tail(out, 1)))
	}
	e.expectOnly(cur.name)
	if got := w.running(t); got != cur.proxyMode {
		t.Errorf("kp runs %s after a refused switch, want %s", got, cur.proxyMode)
	}
	tr.flowing(5)
	tr.stop("")
}

// running is the mode kp reports at /proxyMode.
func (w *tourWorld) running(t *testing.T) string {
	_, body, err := netns.HTTPGet(w.e.w.Node(), "http://"+metricsAddr+"/proxyMode", 2*time.Second)
	if err != nil {
		t.Errorf("/proxyMode: %v", err)
	}
	return body
}

// switchTaken waits until kp's status API shows a switch newer than the
// one numbered last, and returns its number.
func (w *tourWorld) switchTaken(t *testing.T, last uint64) uint64 {
	var id uint64
	w.at(t).eventually("kp taking the switch on", 15*time.Second, func() error {
		m, err := migrationOf(w.e)
		if err != nil {
			return err
		}
		if m == nil || m.ID <= last {
			return fmt.Errorf("no switch after number %d yet", last)
		}
		id = m.ID
		return nil
	})
	return id
}

// migrationOf reads the last switch asked of e's kp (its status socket's
// /kp/v1/migration), nil when none was.
func migrationOf(e *env) (*statusapi.Migration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return e.statusClient().Migration(ctx)
}
