package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/server"
	"github.com/kpproxy/kp/proxy/source"
)

func newProxyCommand(a *app) *cobra.Command {
	o := &options.Options{}
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Run the node proxy (kube-proxy's flags and config file)",
		Long: `Run the node proxy until SIGINT or SIGTERM: watch Services and EndpointSlices and
keep this node's kernel forwarding state in step with them.

The Services come from the Kubernetes API (--kubeconfig, --master, or the in-cluster
configuration when kp runs in a pod), or from a folder of YAML/JSON manifests
(--manifests). Flags have kube-proxy's names and meanings; a KubeProxyConfiguration
file (--config) is read as kube-proxy reads it (strictly, else leniently with a
warning), and as with kube-proxy, beside it only --hostname-override, --master,
the logging flags and kp's own flags apply: the others are logged as ignored. kp
exits when the file changes, so its pod restarts with it. kube-proxy settings kp
does not implement are reported as errors; settings that only tune the process
(OOM score, API client rates) are accepted and logged as ignored. The
--conntrack-* settings are applied at start, as upstream applies them (kp sysctl,
or --init-only, applies them alone). Logs are klog's text, as kube-proxy's.

` + wrap(options.IgnoredFlagsHelp(), 84),
		Example: `  # In a kube-proxy DaemonSet: same arguments
  kp proxy --config /var/lib/kube-proxy/config.conf --hostname-override "$NODE_NAME"

  # Outside a pod, against an API server
  kp proxy --kubeconfig ~/.kube/config --cluster-cidr 10.244.0.0/16,fd00:10:244::/56

  # No cluster: Services and EndpointSlices from a folder, JSON logs
  kp proxy --manifests ./manifests/demo --hostname-override node-1 --log-format json

  # iptables mode, with the iptables-legacy binaries
  kp proxy --proxy-mode iptables --iptables-backend legacy --manifests ./manifests/demo --hostname-override node-1

  # Remove everything kp wrote, as kube-proxy --cleanup does
  kp proxy --cleanup

  # The effective configuration of a DaemonSet's arguments, as a file
  kp proxy --proxy-mode iptables --cluster-cidr 10.244.0.0/16 --write-config-to /tmp/kube-proxy.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// As upstream: --version before anything else, then the
			// settings, then what the flags ask instead of proxying.
			if print, raw := o.Version.Requested(); print {
				return a.printVersion(raw)
			}
			s, err := a.settings(cmd, o)
			switch {
			case err != nil:
				return err
			case o.WriteConfigTo != "":
				return a.writeConfig(o.WriteConfigTo, s)
			case o.Cleanup:
				return a.cleanup(cmd.Context(), s.Config)
			case o.InitOnly:
				a.initNode(cmd.Context(), s)
				a.log.Info("initialization done (--init-only); exiting")
				return nil
			}
			return a.proxy(cmd.Context(), s)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// settings resolves the command's flags and config file, then uses them
// (useSettings): what kp proxy and kp sysctl start with.
func (a *app) settings(cmd *cobra.Command, o *options.Options) (options.Settings, error) {
	s, err := o.Resolve(cmd.Flags(), a.logOpts, a.hostname)
	if err != nil {
		return s, err
	}
	return s, a.useSettings(s)
}

// useSettings rebuilds the logger if the config file changed logging, then
// logs what kp accepted but ignores.
func (a *app) useSettings(s options.Settings) error {
	if s.Log != a.logOpts {
		log, err := options.NewLogger(a.stdout, a.stderr, s.Log)
		if err != nil {
			return err
		}
		a.log = log
	}
	for _, ig := range s.Ignored {
		if ig.Warn {
			a.log.Warn("ignoring kube-proxy setting", "setting", ig.Name, "reason", ig.Reason)
		} else {
			a.log.Info("ignoring kube-proxy setting", "setting", ig.Name, "reason", ig.Reason)
		}
	}
	return nil
}

// writeConfig is --write-config-to: the effective configuration written as
// a KubeProxyConfiguration, then exit, as upstream.
func (a *app) writeConfig(path string, s options.Settings) error {
	notWritten, err := options.WriteConfig(path, s)
	if err != nil {
		return err
	}
	if len(notWritten) > 0 {
		a.log.Warn("the configuration file has no field for these kp settings; pass them as flags",
			"settings", strings.Join(notWritten, ","))
	}
	a.log.Info("Wrote configuration", "file", path)
	return nil
}

// proxy runs the proxy until ctx ends, or until what it started with
// changes (the --config file, the Node's pod CIDRs with NodeCIDR): then it
// returns that as an error, so kp exits 1 and its pod restarts, as
// upstream's does.
func (a *app) proxy(ctx context.Context, s options.Settings) error {
	// What kp's ConfigMap leaves to fill in, then the source: it does not
	// depend on the mode, and a missing one is the first thing to fix.
	warning, err := checkShippedConfig(s)
	if err != nil {
		return err
	}
	if warning != "" {
		a.log.Warn(warning)
	}
	sources, client, err := a.sources(s.Config)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	if s.ConfigFile != "" {
		if err := watchConfigFile(runCtx, s.ConfigFile, s.ConfigFileData, a.log, stop); err != nil {
			return err
		}
	}
	if s.Config.DetectLocal.Mode == proxy.LocalModeNodeCIDR {
		if s, err = a.withPodCIDRs(runCtx, s, client); err != nil {
			return err
		}
	}
	s, backend, choice, err := a.startBackend(runCtx, s)
	if err != nil {
		return err
	}
	cfg := s.Config

	a.log.Info("starting kp proxy", "version", a.version, "mode", cfg.Mode, "node", cfg.HostnameOverride,
		"source", sourceName(cfg), "healthz", cfg.HealthzBindAddress, "metrics", cfg.MetricsBindAddress)
	a.warnDefaultMode(s)
	opts := a.runOptions(cfg, backend, sources)
	if cfg.DetectLocal.Mode == proxy.LocalModeNodeCIDR {
		opts.Observers = append(opts.Observers, &podCIDRWatch{want: cfg.DetectLocal.PodCIDRs, log: a.log, cancel: stop})
	}
	// The Switcher takes the node over after the first sync and switches
	// modes when asked (kp migrate node).
	sw := a.switcher(s, backend, opts.Observers)
	if client != nil {
		sw.SetFinished(migrate.NodeEvents(client, cfg.HostnameOverride, a.log))
	}
	opts.Backend = sw
	opts.Sysctls = append(a.tuneConntrack(s), a.modeSysctls(backend)...)
	opts.ModeChoice = choice
	opts.Inventory = migrate.InventoryPrograms
	err = a.runProxy(runCtx, cfg, opts)
	var restart errRestart
	if errors.As(context.Cause(runCtx), &restart) {
		return restart
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	if err != nil {
		return err
	}
	a.log.Info("kp proxy stopped")
	return nil
}

// withPodCIDRs reads the Node's pod CIDRs into s (and into the settings of
// every other mode auto or a switch may build), for detectLocalMode
// NodeCIDR.
func (a *app) withPodCIDRs(ctx context.Context, s options.Settings, client kubeclient.Interface) (options.Settings, error) {
	cidrs, err := a.nodePodCIDRs(ctx, s.Config, client)
	if err != nil {
		return s, err
	}
	a.log.Info("detecting local traffic by the node's pod CIDRs", "podCIDRs", prefixList(cidrs))
	s.Config.DetectLocal.PodCIDRs = cidrs
	if forMode := s.ForMode; forMode != nil {
		s.ForMode = func(m proxy.Mode) (options.Settings, error) {
			sm, err := forMode(m)
			sm.Config.DetectLocal.PodCIDRs = cidrs
			return sm, err
		}
	}
	return s, nil
}

// runOptions adds to the backend what follows its syncs: the cleaner of
// stale UDP conntrack entries (in every mode: the userspace mode has no
// DNAT entries to clean, but a UDP flow the kernel confirmed to a Service
// address before kp had a rule for it blackholes there too).
func (a *app) runOptions(cfg proxy.Config, backend proxy.Backend, sources []proxy.Source) server.RunOptions {
	opts := server.RunOptions{Backend: backend, Sources: sources, Log: a.log, Build: a.build(),
		SnapshotFacts: snapshotFacts(conntrack.Dialer{})}
	cleaner := conntrack.NewCleaner(conntrack.CleanerConfig{Log: a.log, EnableAccounting: true,
		KeepRedirected: cfg.Mode == proxy.ModeUserspace})
	cleaner.Start()
	opts.Observers = append(opts.Observers, cleaner)
	opts.Collectors = append(opts.Collectors, cleaner.Collectors()...)
	// A backend's own metrics (the iptables mode's, with upstream's names).
	if c, ok := backend.(server.MetricsSource); ok {
		opts.Collectors = append(opts.Collectors, c.Collectors()...)
	}
	return opts
}

// sources picks where Services come from: the folder if --manifests is set,
// otherwise the API server, found by --kubeconfig/--master or, in a pod, the
// in-cluster configuration.
func (a *app) sources(cfg proxy.Config) ([]proxy.Source, kubeclient.Interface, error) {
	if cfg.ManifestsDir != "" {
		if cfg.Kubeconfig != "" || cfg.Master != "" {
			a.log.Info("--manifests is set; the Kubernetes API is not used", "manifests", cfg.ManifestsDir)
		}
		return []proxy.Source{source.NewDirSource(cfg.ManifestsDir, cfg.HostnameOverride, a.log)}, nil, nil
	}
	if cfg.Kubeconfig == "" && cfg.Master == "" && !a.inCluster() {
		return nil, nil, errors.New("no source of Services: pass --kubeconfig FILE or --master URL " +
			"(in a pod the in-cluster configuration is used), or --manifests DIR for a folder of Service and EndpointSlice files")
	}
	client, err := a.newKubeClient(cfg.Kubeconfig, cfg.Master)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return []proxy.Source{source.NewKubeSource(client, cfg.HostnameOverride, cfg.ConfigSyncPeriod, a.log)}, client, nil
}

// inCluster reports whether client-go's in-cluster configuration applies:
// the kubelet sets these variables in every pod.
func (a *app) inCluster() bool {
	return a.getenv("KUBERNETES_SERVICE_HOST") != "" && a.getenv("KUBERNETES_SERVICE_PORT") != ""
}

func sourceName(cfg proxy.Config) string {
	switch {
	case cfg.ManifestsDir != "":
		return "manifests " + cfg.ManifestsDir
	case cfg.Master != "":
		return "kubernetes API " + cfg.Master
	case cfg.Kubeconfig != "":
		return "kubernetes API via " + cfg.Kubeconfig
	}
	return "kubernetes API (in-cluster)"
}

// wrap breaks s into lines of at most width columns, at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	col := 0
	for i, w := range strings.Fields(s) {
		if i > 0 && col+1+len(w) > width {
			b.WriteString("\n")
			col = 0
		} else if i > 0 {
			b.WriteString(" ")
			col++
		}
		b.WriteString(w)
		col += len(w)
	}
	return b.String()
}
