package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy/statusapi"
)

type explainOptions struct {
	from     string
	snapshot string
	output   string
	node     nodeFlags
	timeout  time.Duration
}

func newExplainCommand(a *app) *cobra.Command {
	o := &explainOptions{}
	cmd := &cobra.Command{
		Use:   "explain [--from SRC_IP[:PORT]] [--snapshot FILE] DST_IP:PORT[/tcp|udp|sctp]",
		Short: "Say what kp does with a packet, and why: which Service, which endpoints, DNAT, reject or drop",
		Long: `Explain what kp does with the first packet of a connection to DST_IP:PORT (TCP unless
/udp or /sctp follows): which Service port and which of its addresses that is (ClusterIP,
NodePort on which node address, externalIP, LoadBalancer IP; an unallocated ClusterIP of a
Service CIDR; or no Service at all: the packet is not kp's); the traffic policy that
applies; every endpoint, chosen or not, with why (ready, serving-terminating fallback, not
ready, another zone's or node's hint, not on this node under traffic policy Local); the
outcome (DNAT to one of N, each with its share, reject with a TCP reset or ICMP port
unreachable, or drop, as for a source outside loadBalancerSourceRanges); whether the
source is masqueraded and why; with ClientIP affinity, the entry that pins --from's client
to an endpoint, until when; and the conntrack entries this flow already has.

--from names the client (a pod's address, the node's, or one outside the cluster): the
traffic policy and masquerade depend on it. Without it the usual client is assumed (a pod
for a ClusterIP, an outside client for the others) and the answer says so.

Live, kp explain reads the running kp proxy's snapshot from its status socket (root only;
the socket names the proxy, and so the node's network namespace). With --snapshot it reads
a file kp snapshot wrote, on any machine.

The answer ends with the first packet's path through the running mode's rules, as the
kernel runs them: each rule it matches, with its chain, its text (and in nftables its
handle) as the snapshot's listing shows it, the set or map element it matched, and its
verdict ("one of: ..." where the kernel picks at random); in the ipvs mode the virtual
server with its scheduler and persistence, in the userspace mode the listener.`,
		Example: `  # Where does a pod's DNS query go?
  kp explain --from 10.244.1.10 10.96.0.10:53/udp

  # Why is this NodePort refused? As JSON
  kp explain -o json 192.168.1.20:30080

  # From a snapshot attached to a bug report
  kp explain --snapshot node-a.kpsnap.json --from 203.0.113.9 198.51.100.7:443`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.output != "text" && o.output != "json" {
				return usageErrorf("--output %q: want text or json", o.output)
			}
			p, err := explain.ParsePacket(args[0], o.from)
			if err != nil {
				return usage(err)
			}
			return a.explain(cmd.Context(), o, p)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.from, "from", "", "the client: SRC_IP or SRC_IP:PORT ([IPv6]:PORT)")
	fs.StringVar(&o.snapshot, "snapshot", "", "explain from this file (kp snapshot -o FILE) instead of the running kp proxy")
	fs.StringVarP(&o.output, "output", "o", "text", "text, or json")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up reading the running kp proxy after this long")
	o.node.bind(fs, "")
	return cmd
}

func (a *app) explain(ctx context.Context, o *explainOptions, p explain.Packet) error {
	var snap *statusapi.Snapshot
	var err error
	if o.snapshot != "" {
		snap, err = readSnapshotFile(o.snapshot)
	} else {
		snap, err = a.liveSnapshot(ctx, o.node, o.timeout)
	}
	if err != nil {
		return err
	}
	m, err := explain.FromSnapshot(snap)
	if err != nil {
		return err
	}
	e := explain.Explain(m, p, explain.Options{Version: a.version, RulePaths: rulePathers})
	if o.output == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(e)
	}
	return explain.Write(a.stdout, e)
}

func readSnapshotFile(path string) (*statusapi.Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	snap, err := explain.ReadSnapshot(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return snap, nil
}

func (a *app) liveSnapshot(ctx context.Context, node nodeFlags, timeout time.Duration) (*statusapi.Snapshot, error) {
	src, err := node.open()
	if err != nil {
		return nil, err
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return src.Snapshot(ctx)
}

type snapshotOptions struct {
	output  string
	node    nodeFlags
	timeout time.Duration
}

func newSnapshotCommand(a *app) *cobra.Command {
	o := &snapshotOptions{}
	cmd := &cobra.Command{
		Use:   "snapshot -o FILE",
		Short: "Write what kp explain needs (Services, endpoints, node facts, mode, rules, conntrack) to a file",
		Long: `Write the running kp proxy's snapshot to FILE ("-": standard output), for kp explain
--snapshot on any machine, or to attach to a bug report: every service port with its
endpoints as last synced, the Node and the Service CIDRs, the settings behind masquerade
and NodePorts (detect-local, --nodeport-addresses and the addresses they give), the mode,
its rules as its own tool lists them (nftables: nft -a list table ip kp, or, without the
nft CLI, read through netlink with their rule handles; iptables: kp's chains in
iptables-save -c), the conntrack entries addressed to a Service, and the mode's ClientIP
affinity entries (which client is pinned to which endpoint). The file is JSON, format
kp-snapshot/v1, with the kp version that
took it, written 0600: it names every Service and endpoint of the cluster.`,
		Example: `  kp snapshot -o /tmp/node-a.kpsnap.json
  kubectl exec -n kube-system <kp pod> -- kp snapshot -o - > node-a.kpsnap.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.output == "" {
				return usageErrorf("-o FILE is required (\"-\" for standard output)")
			}
			return a.snapshot(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&o.output, "output", "o", "", "the file to write (\"-\": standard output)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this long")
	o.node.bind(fs, "")
	return cmd
}

func (a *app) snapshot(ctx context.Context, o *snapshotOptions) error {
	snap, err := a.liveSnapshot(ctx, o.node, o.timeout)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if o.output == "-" {
		_, err = a.stdout.Write(data)
		return err
	}
	if err := writeFileAtomic(o.output, data); err != nil {
		return err
	}
	summarizeSnapshot(a.stderr, o.output, snap)
	return nil
}

// writeFileAtomic writes data to path through a temporary file in its
// directory: a reader never sees half a snapshot.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func summarizeSnapshot(w io.Writer, path string, s *statusapi.Snapshot) {
	eps := 0
	for _, sp := range s.Services.ServicePorts {
		eps += len(sp.Endpoints)
	}
	fmt.Fprintf(w, "wrote %s: %s mode, %d service ports, %d endpoints, %d rule listings, %d conntrack entries, %d affinity entries\n",
		path, s.Mode, len(s.Services.ServicePorts), eps, len(s.Rules), len(s.Conntrack), len(s.Affinity))
	for _, e := range []struct{ what, err string }{{"rules", s.RulesError}, {"conntrack", s.ConntrackError}, {"affinity", s.AffinityError},
		{"node facts", s.Proxy.Error}} {
		if e.err != "" {
			fmt.Fprintf(w, "  %s: %s\n", e.what, e.err)
		}
	}
	if s.Services.Generation == 0 {
		fmt.Fprintln(w, "  kp proxy had not synced yet: the snapshot holds no model")
	}
}
