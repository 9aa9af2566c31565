package apiserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kpproxy/kp/test/netns"
)

// Port is the first instance's secure port; instance i listens on Port+i.
const Port = 6443

// AdminUser is the user behind the admin token, in group system:masters.
const AdminUser = "kp-test-admin"

// readyTimeout bounds how long an instance may take to be ready. Generous: on
// a busy 2-core machine a cold start takes well over the usual 3 s, and in
// test/vm's software-emulated VM (KP_VM=1) over two minutes.
var readyTimeout = func() time.Duration {
	if os.Getenv("KP_VM") == "1" {
		return 8 * time.Minute
	}
	return 2 * time.Minute
}()

// bridgeName holds the API server's address in its namespace; every
// connected namespace's veth is a port of it.
const bridgeName = "kpapi0"

// Options shape a Server. The zero value is one kube-apiserver instance
// serving the worlds' Service ranges.
type Options struct {
	// Instances of kube-apiserver sharing the one etcd, as in a highly
	// available control plane (default 1). A test stops one while it keeps
	// using another.
	Instances int
	// ServiceCIDRs is --service-cluster-ip-range (default: netns.ServiceCIDR
	// and netns.ServiceCIDR6, dual-stack).
	ServiceCIDRs []netip.Prefix
	// NodePortRange is --service-node-port-range ("" keeps the API
	// server's default, 30000-32767).
	NodePortRange string
	// FeatureGates is --feature-gates ("" keeps the release's defaults).
	FeatureGates string
	// ExtraArgs are more kube-apiserver flags, after the harness's own
	// (a repeated flag's last value wins).
	ExtraArgs []string
	// EtcdSeed is an etcd data folder (EtcdDataDir of a Server stopped
	// with Stop) copied as this one's before etcd starts: its objects are
	// there from the start. Made with the same ServiceCIDRs.
	EtcdSeed string
}

// Server is etcd plus one or more kube-apiserver instances in a namespace
// of their own. Its methods are safe for concurrent use.
type Server struct {
	t          testing.TB
	ns         string
	index      int
	addr       netip.Addr
	dir        string
	pki        *pki
	adminToken string
	etcd       *netns.Process
	instances  []*Instance

	mu    sync.Mutex
	links int // namespaces connected so far
}

// Instance is one kube-apiserver process.
type Instance struct {
	srv   *Server
	Index int
	Addr  netip.AddrPort // where it serves, https
	Proc  *netns.Process
}

var servers atomic.Int64

// Start runs etcd and the API server instances, waits until every instance
// is ready, and stops them and removes their namespace when t ends. It skips
// t when not root or when the binaries are not built (fails under CI).
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	netns.Require(t)
	apiserverBin, etcdBin := Bin(t, KubeAPIServer), Bin(t, Etcd)
	if opts.Instances <= 0 {
		opts.Instances = 1
	}
	if len(opts.ServiceCIDRs) == 0 {
		opts.ServiceCIDRs = []netip.Prefix{netns.ServiceCIDR, netns.ServiceCIDR6}
	}
	n := int(servers.Add(1))
	s := &Server{
		t:     t,
		ns:    netns.NewNamespace(t, "api"),
		index: 1 + (n-1)%250,
		dir:   t.TempDir(),
	}
	s.addr = netip.AddrFrom4([4]byte{10, 250, byte(s.index), 1})
	for _, c := range [][]string{
		// Its own address, not its lowest port's (netns.BridgeMAC).
		{"-n", s.ns, "link", "add", bridgeName, "address", netns.BridgeMAC(1, s.index), "type", "bridge"},
		{"-n", s.ns, "addr", "add", s.addr.String() + "/24", "dev", bridgeName},
		{"-n", s.ns, "link", "set", bridgeName, "up"},
	} {
		if err := netns.IP(c...); err != nil {
			t.Fatalf("start API server: %v", err)
		}
	}

	// The serving certificate also names the first address of the Service
	// range: the "kubernetes" Service's ClusterIP, which pods use.
	ips := []net.IP{s.addr.AsSlice(), net.ParseIP("127.0.0.1")}
	for _, p := range opts.ServiceCIDRs {
		ips = append(ips, p.Masked().Addr().Next().AsSlice())
	}
	var err error
	if s.pki, err = newPKI(s.dir, ips); err != nil {
		t.Fatalf("start API server: certificates: %v", err)
	}
	s.adminToken = randomToken()
	tokens := filepath.Join(s.dir, "tokens.csv")
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", s.adminToken, AdminUser, AdminUser)
	if err := os.WriteFile(tokens, []byte(line), 0o600); err != nil {
		t.Fatalf("start API server: %v", err)
	}

	if opts.EtcdSeed != "" {
		// cp -a keeps etcd's 0700 folders; the seed may be on a read-only
		// file system (the VM's view of the host's).
		if out, err := exec.Command("cp", "-a", opts.EtcdSeed, s.EtcdDataDir()).CombinedOutput(); err != nil {
			t.Fatalf("start API server: copy the etcd seed %s: %v: %s", opts.EtcdSeed, err, out)
		}
	}
	s.etcd = netns.StartIn(t, s.ns, etcdBin,
		"--name", "default",
		"--data-dir", s.EtcdDataDir(),
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		// A test's data is thrown away: no need to wait for the disk.
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	s.waitEtcd()

	cidrs := make([]string, len(opts.ServiceCIDRs))
	for i, p := range opts.ServiceCIDRs {
		cidrs[i] = p.String()
	}
	for i := 0; i < opts.Instances; i++ {
		inst := &Instance{srv: s, Index: i, Addr: netip.AddrPortFrom(s.addr, uint16(Port+i))}
		args := []string{
			"--etcd-servers", "http://127.0.0.1:2379",
			"--bind-address", s.addr.String(),
			"--advertise-address", s.addr.String(),
			"--secure-port", fmt.Sprint(Port + i),
			"--cert-dir", filepath.Join(s.dir, fmt.Sprintf("certs-%d", i)),
			"--tls-cert-file", s.pki.certFile,
			"--tls-private-key-file", s.pki.keyFile,
			"--client-ca-file", s.pki.caFile,
			"--token-auth-file", tokens,
			"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file", s.pki.saPub,
			"--service-account-signing-key-file", s.pki.saKey,
			"--authorization-mode", "RBAC",
			// As every kubeadm or kind cluster: node agents such as kp's
			// sysctl init container and upstream's [Privileged] e2e pods
			// run privileged.
			"--allow-privileged=true",
			"--service-cluster-ip-range", strings.Join(cidrs, ","),
			"--profiling=false",
			"--v", "0",
		}
		if opts.NodePortRange != "" {
			args = append(args, "--service-node-port-range", opts.NodePortRange)
		}
		if opts.FeatureGates != "" {
			args = append(args, "--feature-gates", opts.FeatureGates)
		}
		args = append(args, opts.ExtraArgs...)
		if i > 0 {
			// Instances share an address but not a port; two lease
			// reconcilers would fight over the kubernetes Service's
			// endpoint port. The first one publishes it.
			args = append(args, "--endpoint-reconciler-type", "none")
		}
		inst.Proc = netns.StartIn(t, s.ns, apiserverBin, args...)
		s.instances = append(s.instances, inst)
	}
	for _, inst := range s.instances {
		if err := inst.waitReady(); err != nil {
			t.Fatalf("start API server: %v", err)
		}
	}
	return s
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) waitEtcd() {
	s.t.Helper()
	err := s.etcd.WaitHTTP("http://127.0.0.1:2379/health", readyTimeout, func(code int, body string) bool {
		return code == 200 && strings.Contains(body, `"health":"true"`)
	})
	if err != nil {
		s.t.Fatalf("etcd not ready: %v", err)
	}
}

// EtcdDataDir is etcd's data folder: after Stop, a seed for
// Options.EtcdSeed.
func (s *Server) EtcdDataDir() string { return filepath.Join(s.dir, "etcd") }

// Stop stops every API server instance, then etcd, each with SIGTERM: etcd
// closes its database cleanly, so its data folder can seed another.
func (s *Server) Stop() error {
	var errs []error
	for _, inst := range s.instances {
		if err := inst.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop kube-apiserver %d: %w", inst.Index, err))
		}
	}
	if err := s.etcd.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("stop etcd: %w", err))
	}
	return errors.Join(errs...)
}

// NS is the namespace etcd and the API server run in.
func (s *Server) NS() string { return s.ns }

// Addr is the address every instance listens on.
func (s *Server) Addr() netip.Addr { return s.addr }

// CA is the PEM certificate clients must trust.
func (s *Server) CA() []byte { return s.pki.caPEM }

// CAFile is the CA certificate's PEM file, for programs that take a path
// (kube-controller-manager's --root-ca-file).
func (s *Server) CAFile() string { return s.pki.caFile }

// ServiceAccountKeyFile is the private key service account tokens are
// signed with: kube-controller-manager's --service-account-private-key-file.
func (s *Server) ServiceAccountKeyFile() string { return s.pki.saKey }

// AdminToken authenticates as AdminUser (system:masters).
func (s *Server) AdminToken() string { return s.adminToken }

// Instances lists the kube-apiserver instances, in port order.
func (s *Server) Instances() []*Instance { return s.instances }

// Instance returns instance i.
func (s *Server) Instance(i int) *Instance { return s.instances[i] }

// Client is an admin client of the last instance: the one tests that stop
// another keep using.
func (s *Server) Client() kubernetes.Interface {
	s.t.Helper()
	return s.instances[len(s.instances)-1].Client(s.adminToken)
}

// Connect links namespace ns to the API server's bridge with a veth and
// returns ns's address on it: from ns, every instance is then reachable at
// Addr. routesBack are prefixes behind ns (a world's pods) that the API
// server's namespace routes through ns, so those may reach it too.
func (s *Server) Connect(ns string, routesBack ...netip.Prefix) netip.Addr {
	s.t.Helper()
	s.mu.Lock()
	s.links++
	k := s.links
	s.mu.Unlock()
	if k > 250 {
		s.t.Fatalf("connect %s to the API server: at most 250 namespaces", ns)
	}
	local := netip.AddrFrom4([4]byte{10, 250, byte(s.index), byte(1 + k)})
	peer := fmt.Sprintf("kpn%d", k)
	cmds := [][]string{
		{"-n", ns, "link", "add", bridgeName, "type", "veth", "peer", "name", peer, "netns", s.ns},
		{"-n", ns, "addr", "add", local.String() + "/24", "dev", bridgeName},
		{"-n", ns, "link", "set", bridgeName, "up"},
		{"-n", s.ns, "link", "set", peer, "master", bridgeName},
		{"-n", s.ns, "link", "set", peer, "up"},
	}
	for _, p := range routesBack {
		cmds = append(cmds, []string{"-n", s.ns, "route", "add", p.String(), "via", local.String()})
	}
	for _, c := range cmds {
		if err := netns.IP(c...); err != nil {
			s.t.Fatalf("connect %s to the API server: %v", ns, err)
		}
	}
	return local
}

// Kubeconfig writes a kubeconfig for instance i authenticating with token
// into a new file and returns its path. Processes that use it must run in a
// namespace that was connected (or the server's own).
func (s *Server) Kubeconfig(i int, token string) string {
	s.t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kp-test"] = &clientcmdapi.Cluster{
		Server:                   "https://" + s.instances[i].Addr.String(),
		CertificateAuthorityData: s.pki.caPEM,
	}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kp-test"] = &clientcmdapi.Context{Cluster: "kp-test", AuthInfo: "user"}
	cfg.CurrentContext = "kp-test"
	f, err := os.CreateTemp(s.dir, "kubeconfig-*")
	if err != nil {
		s.t.Fatalf("kubeconfig: %v", err)
	}
	f.Close()
	if err := clientcmd.WriteToFile(*cfg, f.Name()); err != nil {
		s.t.Fatalf("kubeconfig: %v", err)
	}
	return f.Name()
}

// Kubectl runs the kubectl built with the API server, as the admin of the
// last instance, inside the server's namespace, and returns its combined
// output.
func (s *Server) Kubectl(args ...string) (string, error) {
	s.t.Helper()
	bin := Bin(s.t, Kubectl)
	kubeconfig := s.Kubeconfig(len(s.instances)-1, s.adminToken)
	return netns.Exec(s.ns, append([]string{bin, "--kubeconfig", kubeconfig}, args...)...)
}

// ServiceAccountToken asks the API server for a token of service account
// namespace/name (TokenRequest, valid for an hour), as the kubelet does for
// a pod.
func (s *Server) ServiceAccountToken(ctx context.Context, namespace, name string) (string, error) {
	expiry := int64(3600)
	tr, err := s.Client().CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}},
		metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for service account %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// Config is a client configuration for the instance, authenticating with
// token. Its connections are opened inside the server's namespace, so the
// test process reaches the server without any route from the root
// namespace.
func (inst *Instance) Config(token string) *rest.Config {
	ns := inst.srv.ns
	return &rest.Config{
		Host:            "https://" + inst.Addr.String(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: inst.srv.pki.caPEM},
		QPS:             100,
		Burst:           200,
		// The tests write non-canonical addresses on purpose (kp must
		// read them as the API server does); its warnings about each one
		// would fill the output.
		WarningHandler: rest.NoWarnings{},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.DialConn(ctx, ns, network, addr)
		},
	}
}

// Client is a client of the instance authenticating with token.
func (inst *Instance) Client(token string) kubernetes.Interface {
	inst.srv.t.Helper()
	c, err := kubernetes.NewForConfig(inst.Config(token))
	if err != nil {
		inst.srv.t.Fatalf("API client: %v", err)
	}
	return c
}

// Stop stops the instance (SIGTERM, as systemd or the kubelet would) and
// waits for it to exit.
func (inst *Instance) Stop() error { return inst.Proc.Stop() }

// Start starts the stopped instance again and waits until it is ready.
func (inst *Instance) Start() error {
	if err := inst.Proc.Start(); err != nil {
		return err
	}
	return inst.waitReady()
}

// waitReady polls /readyz until it answers ok.
func (inst *Instance) waitReady() error {
	c := inst.Client(inst.srv.adminToken)
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}
		if !inst.Proc.Running() {
			return fmt.Errorf("kube-apiserver %s exited before it was ready: %v\n%s",
				inst.Addr, inst.Proc.ExitErr(), tail(inst.Proc.Log(), 40))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver %s not ready after %v: %v %s", inst.Addr, readyTimeout, err, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
