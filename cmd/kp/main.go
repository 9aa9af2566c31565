// Command kp is a Kubernetes node proxy, a drop-in for kube-proxy: it turns
// the cluster's Services and EndpointSlices into one nftables table (or, as a
// fallback, a legacy mode) on the node it runs on.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/internal/sysctl"
	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/legacy/ipvs"
	"github.com/kpproxy/kp/legacy/userspace"
	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/nft"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/server"
	"github.com/kpproxy/kp/proxy/source"
)

// Set at build time by the Makefile with -ldflags -X. date is the
// commit's date (RFC 3339, UTC), so that two builds of one commit are the
// same file.
var (
	version = "dev"
	commit  = "dev"
	date    = "unknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, newApp(os.Stdout, os.Stderr), os.Args)
	stop()
	os.Exit(code)
}

// backendFactory builds one mode's backend.
type backendFactory func(cfg proxy.Config, log *slog.Logger) (proxy.Backend, error)

// app is what the commands share: output streams, the logger, and the seams
// tests replace (host name, environment, backends, the proxy loop).
type app struct {
	stdout, stderr        io.Writer
	version, commit, date string

	hostname func() (string, error)
	getenv   func(string) string
	// backends holds every mode kp has built; a recognised mode missing here
	// is "not implemented yet".
	backends      map[proxy.Mode]backendFactory
	newKubeClient func(kubeconfig, master string) (kubeclient.Interface, error)
	// clusterClient is kp migrate cluster's API client, and the API
	// server's address it reaches.
	clusterClient func(kubeconfig, context string) (kubeclient.Interface, string, error)
	runProxy      func(ctx context.Context, cfg proxy.Config, opts server.RunOptions) error
	// tuner writes conntrack sysctls (tests point it at a folder).
	tuner conntrack.Tuner
	// sysctls sets the proxy modes' sysctls (sysctl.Dir; tests: a folder,
	// or one that refuses writes as a read-only /proc/sys does).
	sysctls interface {
		Ensure(name, value string) (old string, err error)
	}
	// inventory lists what programs Services in a node's namespace (kp
	// migrate node; tests: a list of their own, not the host's kernel).
	inventory func(*nodeSource, context.Context) ([]migrate.Found, error)
	// podCIDRTimeout bounds the wait for the Node's pod CIDRs
	// (detectLocalMode NodeCIDR).
	podCIDRTimeout time.Duration

	logOpts options.LogOptions // bound to the root's persistent flags
	log     *slog.Logger
}

func newApp(stdout, stderr io.Writer) *app {
	v, c := version, commit
	if info, ok := debug.ReadBuildInfo(); ok {
		v, c = moduleVersion(v, c, info)
	}
	return &app{
		stdout:   stdout,
		stderr:   stderr,
		version:  v,
		commit:   c,
		date:     date,
		hostname: os.Hostname,
		getenv:   os.Getenv,
		backends: map[proxy.Mode]backendFactory{
			proxy.ModeNFTables: func(cfg proxy.Config, log *slog.Logger) (proxy.Backend, error) {
				return nft.New(cfg, log)
			},
			proxy.ModeIPTables: func(cfg proxy.Config, log *slog.Logger) (proxy.Backend, error) {
				return iptables.New(cfg, log)
			},
			proxy.ModeIPVS: func(cfg proxy.Config, log *slog.Logger) (proxy.Backend, error) {
				return ipvs.New(cfg, log)
			},
			proxy.ModeUserspace: func(cfg proxy.Config, log *slog.Logger) (proxy.Backend, error) {
				return userspace.New(cfg, log)
			},
			proxy.ModeNone: func(proxy.Config, *slog.Logger) (proxy.Backend, error) { return proxy.NoneBackend{}, nil },
		},
		newKubeClient:  source.NewKubeClient,
		clusterClient:  clusterClient,
		runProxy:       server.Run,
		podCIDRTimeout: podCIDRTimeout,
		inventory:      (*nodeSource).inventory,
		sysctls:        sysctl.Dir(""),
		logOpts:        options.DefaultLogOptions(),
	}
}

// errReported is returned by a command that has already told the user what
// went wrong; run exits 1 without printing it again.
var errReported = errors.New("already reported")

// run executes the command line args (args[0] is the program name) and returns
// the process exit code (exitcode.go). An error is printed as "kp: ...",
// without a stack trace or a usage dump.
func run(ctx context.Context, a *app, args []string) int {
	root := newRootCommand(a)
	root.SetArgs(commandArgs(args))
	started := false
	noteStarts(root, &started)
	err := root.ExecuteContext(ctx)
	if err != nil && !errors.Is(err, errReported) {
		fmt.Fprintf(a.stderr, "kp: %v\n", err)
	}
	return exitCode(err, started)
}

// commandArgs maps the name the binary was invoked by onto a subcommand: a
// kp-top link opens kp top, and kp installed as kube-proxy (an image that
// keeps upstream's path) runs kp proxy with the DaemonSet's arguments.
func commandArgs(args []string) []string {
	if len(args) == 0 {
		return nil
	}
	rest := args[1:]
	switch filepath.Base(args[0]) {
	case "kp-top":
		return append([]string{"top"}, rest...)
	case "kube-proxy":
		return append([]string{"proxy"}, rest...)
	}
	return rest
}

func newRootCommand(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "kp",
		Short: "kp is a Kubernetes node proxy, a drop-in for kube-proxy",
		Long: `kp is a Kubernetes node proxy: it turns the cluster's Services and EndpointSlices
into forwarding state in the kernel of the node it runs on, by default one nftables
table. 'kp proxy' takes kube-proxy's flags and configuration file, so a kube-proxy
DaemonSet can run kp with its arguments unchanged.`,
		Example: `  # Proxy with a kube-proxy DaemonSet's arguments
  kp proxy --config /var/lib/kube-proxy/config.conf --hostname-override "$NODE_NAME"

  # Proxy the Services described in a folder of manifests, no cluster needed
  kp proxy --manifests ./manifests/demo --hostname-override node-1`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			log, err := options.NewLogger(a.stdout, a.stderr, a.logOpts)
			if err != nil {
				return err
			}
			a.log = log
			return nil
		},
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())
	})
	a.logOpts.AddFlags(root.PersistentFlags())

	root.AddCommand(newProxyCommand(a), newCleanupCommand(a), newMigrateCommand(a), newSysctlCommand(a), newVersionCommand(a), newTopCommand(a), newFlowsCommand(a), newStatusCommand(a),
		newExplainCommand(a), newSnapshotCommand(a))
	// cobra's completion command (kp completion bash|zsh|fish|powershell),
	// added now rather than at Execute, so that it is in the tree
	// noteStarts wraps and its help ends like every other.
	root.InitDefaultCompletionCmd()
	// cobra's default usage, then the exit codes. A usage template would
	// print the same, but it links text/template, whose calls of methods by
	// name keep every exported method of every type in the binary: 4.8 MB
	// more text, and about 3.5 MiB more RSS in every kp process
	// (test/bench/NOTES.md, "The regression gate"; cmd/kp/deps_test.go).
	usage := root.UsageFunc()
	root.SetUsageFunc(func(c *cobra.Command) error {
		if err := usage(c); err != nil {
			return err
		}
		_, err := io.WriteString(c.OutOrStderr(), exitCodesHelp)
		return err
	})
	return root
}
