package options

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/legacy/ipvs"
	"github.com/kpproxy/kp/proxy"
)

// ipvsOptions are upstream's --ipvs-* flags.
type ipvsOptions struct {
	scheduler                             string
	strictARP                             bool
	excludeCIDRs                          []string
	tcpTimeout, tcpFinTimeout, udpTimeout time.Duration
	syncPeriod, minSyncPeriod             time.Duration
}

func (o *ipvsOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.scheduler, "ipvs-scheduler", "",
		"The IPVS scheduler in ipvs mode: "+strings.Join(ipvs.Schedulers, ", ")+" (rr when empty). Each needs its kernel module ip_vs_<name>.")
	fs.BoolVar(&o.strictARP, "ipvs-strict-arp", false,
		"In ipvs mode, set arp_ignore=1 and arp_announce=2 so the node answers no ARP for the Service addresses on kp-ipvs0.")
	fs.StringSliceVar(&o.excludeCIDRs, "ipvs-exclude-cidrs", nil,
		"CIDRs whose IPVS virtual servers kp never deletes in ipvs mode (other programs' services).")
	fs.DurationVar(&o.tcpTimeout, "ipvs-tcp-timeout", 0, "IPVS's timeout of idle established TCP connections (0 keeps the kernel's).")
	fs.DurationVar(&o.tcpFinTimeout, "ipvs-tcpfin-timeout", 0, "IPVS's timeout of TCP connections after a FIN (0 keeps the kernel's).")
	fs.DurationVar(&o.udpTimeout, "ipvs-udp-timeout", 0, "IPVS's timeout of UDP flows (0 keeps the kernel's).")
	fs.DurationVar(&o.syncPeriod, "ipvs-sync-period", defaultSyncPeriod,
		"Upstream's --sync-period in ipvs mode (--sync-period, kp's name, wins). Must be greater than 0.")
	fs.DurationVar(&o.minSyncPeriod, "ipvs-min-sync-period", defaultMinSyncPeriod,
		"Upstream's --min-sync-period in ipvs mode (--min-sync-period, kp's name, wins).")
}

// apply sets the ipvs flags given on the command line.
func (o *ipvsOptions) apply(changed func(string) bool, s *Settings) []error {
	var errs []error
	fail := func(flag, value string, err error) {
		errs = append(errs, fmt.Errorf("--%s %q: %w", flag, value, err))
	}
	c := &s.Config.IPVS
	if changed("ipvs-scheduler") {
		if err := ipvs.CheckScheduler(o.scheduler); err != nil {
			fail("ipvs-scheduler", o.scheduler, err)
		}
		c.Scheduler = o.scheduler
	}
	if changed("ipvs-strict-arp") {
		c.StrictARP = o.strictARP
	}
	if changed("ipvs-exclude-cidrs") {
		cidrs, err := parseCIDRs(o.excludeCIDRs)
		if err != nil {
			fail("ipvs-exclude-cidrs", strings.Join(o.excludeCIDRs, ","), err)
		}
		c.ExcludeCIDRs = cidrs
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
		dst  *time.Duration
	}{
		{"ipvs-tcp-timeout", o.tcpTimeout, &c.TCPTimeout},
		{"ipvs-tcpfin-timeout", o.tcpFinTimeout, &c.TCPFinTimeout},
		{"ipvs-udp-timeout", o.udpTimeout, &c.UDPTimeout},
	} {
		if changed(d.flag) {
			if err := checkDuration(d.v, true); err != nil {
				fail(d.flag, d.v.String(), err)
			}
			*d.dst = d.v
		}
	}
	// Upstream's names apply in ipvs mode only, and only where kp's
	// --sync-period and --min-sync-period were not given.
	ipvsMode := s.Config.Mode == proxy.ModeIPVS
	if ipvsMode && changed("ipvs-sync-period") && !changed("sync-period") {
		if err := checkDuration(o.syncPeriod, false); err != nil {
			fail("ipvs-sync-period", o.syncPeriod.String(), err)
		}
		s.Config.SyncPeriod = o.syncPeriod
	}
	if ipvsMode && changed("ipvs-min-sync-period") && !changed("min-sync-period") {
		if err := checkDuration(o.minSyncPeriod, true); err != nil {
			fail("ipvs-min-sync-period", o.minSyncPeriod.String(), err)
		}
		s.Config.MinSyncPeriod = o.minSyncPeriod
	}
	return errs
}

// applyIPVSSection reads the config file's ipvs section (upstream reads it
// whatever the mode; it only acts in ipvs mode).
func applyIPVSSection(c KubeProxyIPVSConfiguration, s *Settings) []error {
	var errs []error
	if c.Scheduler != "" {
		if err := ipvs.CheckScheduler(c.Scheduler); err != nil {
			errs = append(errs, fmt.Errorf("ipvs.scheduler %q: %w", c.Scheduler, err))
		}
		s.Config.IPVS.Scheduler = c.Scheduler
	}
	s.Config.IPVS.StrictARP = s.Config.IPVS.StrictARP || c.StrictARP
	if len(c.ExcludeCIDRs) > 0 {
		cidrs, err := parseCIDRs(c.ExcludeCIDRs)
		if err != nil {
			errs = append(errs, fmt.Errorf("ipvs.excludeCIDRs %q: %w", strings.Join(c.ExcludeCIDRs, ","), err))
		}
		s.Config.IPVS.ExcludeCIDRs = cidrs
	}
	for _, d := range []struct {
		field string
		v     time.Duration
		dst   *time.Duration
	}{
		{"ipvs.tcpTimeout", c.TCPTimeout.Duration, &s.Config.IPVS.TCPTimeout},
		{"ipvs.tcpFinTimeout", c.TCPFinTimeout.Duration, &s.Config.IPVS.TCPFinTimeout},
		{"ipvs.udpTimeout", c.UDPTimeout.Duration, &s.Config.IPVS.UDPTimeout},
	} {
		if d.v == 0 {
			continue
		}
		if err := checkDuration(d.v, true); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", d.field, d.v, err))
		}
		*d.dst = d.v
	}
	return errs
}
