package e2e

// kp as the shipped DaemonSet runs it: manifests/daemonset.yaml's init
// container and proxy container, each with its command, volumes and
// securityContext as the file says (parsed, not copied here), and
// manifests/configmap.yaml's config.conf, run in a node namespace the way a
// container runtime would run them. The emulation, and what it leaves out:
//
//   - capabilities: the proxy container's bounding set is its add list
//     (drop: [ALL]), with no inheritable ones (setpriv), so root's exec of
//     kp, and of every iptables or ipset kp runs, holds those and no other;
//     allowPrivilegeEscalation: false is no_new_privs. The privileged init
//     container keeps every capability.
//   - readOnlyRootFilesystem: kp's mount namespace has every mount of the
//     host read-only (its root, /tmp, /run, and the others) but /proc and
//     /dev, which a container has of its own; the volumes are mounted
//     writable on top: an emptyDir as a tmpfs of its sizeLimit, a hostPath
//     (the node's /run/xtables.lock) bound onto itself. A configMap is the
//     test's folder of the ConfigMap's files, read-only with the rest.
//   - a container without privileges has /proc/sys and /sys read-only (the
//     runtime's read-only paths and sysfs); the privileged init container
//     has both writable.
//   - paths: the container's mountPaths (/var/lib/kp, /run/kp) are the
//     test's folders, rewritten in the command; kp's default status socket
//     (/run/kp/kp.sock) is passed as --status-socket in the emptyDir's folder.
//   - not emulated: the seccomp profile (RuntimeDefault), the container's
//     own root filesystem (kp sees the host's, read-only), its PID
//     namespace and /dev. The real-node tests (test/nodes) run the same
//     manifest under containerd and runc, with all of it, in nftables mode.
//
// What the test adds to the proxy container's command: kp's --manifests
// (the world has no API server) and --status-socket (above). What it
// changes in config.conf: the mode (the DaemonSet's way to choose it), the
// cluster's pod CIDR (the one value a user must set), and
// conntrack.maxPerCore 0: a test node is a network namespace, and the
// kernel lets only the initial one set nf_conntrack_max (the init step
// would warn about it, rightly). The iptables backend is kp's detection,
// as the DaemonSet ships no --iptables-backend: the test writes the
// kubelet's hint chain in the mode's flavor first, as the kubelet of such
// a node does.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// daemonSetModes are the modes the DaemonSet's securityContext is proven
// for: the kernel modes on the host, ipvs in the VM (TestIPVSModeInTheVM).
var daemonSetModes = []mode{modeNFTables, modeIPTablesNFT, modeIPTablesLegacy, modeIPVS}

// sysctlWarning matches a line of kp's log (klog's text format, the
// DaemonSet's) that warns (W) or errs (E) about a sysctl, or that says, at
// any level, that kp could not write one: a sysctl kp wants and finds
// neither set by the init step nor writable (kp top's flow counters, say)
// is something the DaemonSet fails to give it, warned about or not.
var sysctlWarning = regexp.MustCompile(`(?mi)^(?:[WE]\d{4} .*sysctl|.*sysctl.*(?:read-only file system|permission denied)).*$`)

func TestDaemonSetsContainersAsShippedServeWithNoSysctlWarning(t *testing.T) {
	netns.Require(t, "setpriv", "unshare", "findmnt", "mount")
	ds := shippedContainers(t)
	t.Parallel()
	for _, m := range selectedModes(t) {
		if !slices.ContainsFunc(daemonSetModes, func(d mode) bool { return d.name == m.name }) {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			e := newEnv(t, m, 3)
			pods := e.w.Pods()
			svc := web(pods[0], pods[1])
			svc.Type, svc.Ports[0].NodePort, svc.Ports[1].NodePort = v1.ServiceTypeNodePort, 30080, 30053
			e.write("web.yaml", svc)
			if m.backend != "" {
				e.kubeletHint(m.backend)
			}
			pod := ds.podIn(e, m)

			// Positive control: the proxy container without the init
			// step warns, naming a sysctl; the check below catches it.
			e.kp = pod.start(pod.proxy)
			e.eventually("kp warns about a sysctl without the init step", 15*time.Second, func() error {
				if sysctlWarning.MatchString(e.kp.Log()) {
					return nil
				}
				return fmt.Errorf("no warning about a sysctl in kp's log yet")
			})
			t.Logf("without the init step (the check's positive control): %s", strings.Join(sysctlWarning.FindAllString(e.kp.Log(), -1), "\n"))
			if err := e.kp.Stop(); err != nil {
				t.Logf("stop kp: %v", err)
			}

			// The pod as the kubelet starts it: the init container to
			// its end, then the proxy container.
			start := time.Now()
			out, err := e.w.Exec(e.w.Node(), pod.argv(pod.init)...)
			if err != nil {
				t.Fatalf("the init container %q: %v\n%s", ds.init.Name, err, out)
			}
			if w := sysctlWarning.FindAllString(out, -1); len(w) > 0 {
				t.Errorf("the privileged init container warns about a sysctl:\n%s", strings.Join(w, "\n"))
			}
			t.Logf("the init container (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
			e.kp = pod.start(pod.proxy)
			e.waitHealthy()
			pod.checkConfinement(e.kp.Pid())
			// kp checks the sysctls at start: before the traffic, whose
			// failures end the test; once more at its end.
			log := e.kp.Log()
			if w := sysctlWarning.FindAllString(log, -1); len(w) > 0 {
				t.Errorf("kp in the proxy container warns about a sysctl after the init step:\n%s", strings.Join(w, "\n"))
			}

			names := e.podNames(pods[0], pods[1])
			e.answers(pods[2].NS, "tcp", webTCP, names...)
			e.answers(pods[2].NS, "udp", webUDP, names...)
			nodePort := hostPort(e.w.NodeIP().String(), 30080)
			e.answers(e.w.Client(), "tcp", nodePort, names...)
			e.answers(e.w.Client(), "udp", hostPort(e.w.NodeIP().String(), 30053), names...)
			if m.iptables() {
				// What the init step's route_localnet is for.
				e.answers(e.w.Node(), "tcp", "127.0.0.1:30080", names...)
			}

			// kp's status socket in the emptyDir, as root on the node
			// reaches it: /proc/<kp's pid>/root/...
			e.socket = fmt.Sprintf("/proc/%d/root%s", e.kp.Pid(), pod.statusSocket)
			status, err := e.statusClient().Status(t.Context())
			if err != nil {
				t.Fatalf("kp's status through the emptyDir's socket: %v", err)
			}
			if status.Mode != m.proxyMode || (m.iptables() && status.IPTablesBackend != m.backend) {
				t.Errorf("kp runs %s mode, iptables backend %q; want %s, %q", status.Mode, status.IPTablesBackend, m.proxyMode, m.backend)
			}
			// The ipvs mode's chains too are in the flavor detected
			// (the status names the iptables mode's only).
			if m.backend != "" && ruleLine(e.rules(), m.entryChain()) == "" {
				t.Errorf("no %s chain in %s's iptables:\n%s", m.entryChain(), m.backend, e.rules())
			}
			for _, s := range status.Sysctls {
				if s.Error != "" || s.Value != s.Want {
					t.Errorf("sysctl %s = %s, want %s (%s)", s.Name, s.Value, s.Want, s.Error)
				}
			}
			if w := sysctlWarning.FindAllString(strings.TrimPrefix(e.kp.Log(), log), -1); len(w) > 0 {
				t.Errorf("kp in the proxy container warns about a sysctl while it serves:\n%s", strings.Join(w, "\n"))
			}
		})
	}
}

// kubeletHint writes the kubelet's hint chain in the iptables flavor
// backend of the node, both families, as kubelet 1.17+ does on a node
// whose iptables is that flavor: kp's detection reads it.
func (e *env) kubeletHint(backend string) {
	e.t.Helper()
	for _, bin := range []string{"iptables-" + backend, "ip6tables-" + backend} {
		if out, err := e.w.Exec(e.w.Node(), bin, "-w", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"); err != nil {
			e.t.Fatalf("the kubelet's hint chain: %v\n%s", err, out)
		}
	}
}

// daemonSet is what the test takes from the shipped manifests.
type daemonSet struct {
	init, proxy v1.Container
	volumes     map[string]v1.Volume
	configMap   *v1.ConfigMap
}

// shippedContainers reads manifests/daemonset.yaml (shippedDaemonSet) and
// configmap.yaml: the init container sysctl, the proxy container kp, their
// volumes and the ConfigMap the config volume names.
func shippedContainers(t *testing.T) daemonSet {
	t.Helper()
	ds := shippedDaemonSet(t)
	y, err := os.ReadFile(filepath.Join(manifestsDir(t), "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, y)
	cm, ok := (*v1.ConfigMap)(nil), false
	if len(objs) == 1 {
		cm, ok = objs[0].(*v1.ConfigMap)
	}
	if !ok {
		t.Fatalf("manifests/configmap.yaml holds %d objects, want one ConfigMap", len(objs))
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Fatalf("the DaemonSet's pods are not on the host network; the test runs kp in the node's")
	}
	d := daemonSet{volumes: map[string]v1.Volume{}, configMap: cm}
	for _, v := range spec.Volumes {
		d.volumes[v.Name] = v
	}
	find := func(list []v1.Container, name string) v1.Container {
		for _, c := range list {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("the DaemonSet has no container %q", name)
		return v1.Container{}
	}
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("the DaemonSet has %d init containers and %d containers; the test runs one of each", len(spec.InitContainers), len(spec.Containers))
	}
	d.init, d.proxy = find(spec.InitContainers, "sysctl"), find(spec.Containers, "kp")
	return d
}

// dsPod is the DaemonSet's pod in one test's node: the folders that stand
// for its volumes and the kp binary that stands for the image's.
type dsPod struct {
	t            *testing.T
	e            *env
	ds           daemonSet
	init, proxy  v1.Container
	kp           string
	folders      map[string]string // volume name → the test's folder
	statusSocket string            // kp's default socket, in the emptyDir's folder
}

// podIn makes the pod's volumes for e in mode m: the ConfigMap's files
// (config.conf in mode m, the world's pod CIDR, nf_conntrack_max left
// alone) and a folder per emptyDir.
func (ds daemonSet) podIn(e *env, m mode) *dsPod {
	t := e.t
	t.Helper()
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		t.Fatal(err)
	}
	p := &dsPod{t: t, e: e, ds: ds, init: ds.init, proxy: ds.proxy, kp: kp, folders: map[string]string{}}
	for name, v := range ds.volumes {
		switch {
		case v.ConfigMap != nil:
			if v.ConfigMap.Name != ds.configMap.Name || len(v.ConfigMap.Items) > 0 {
				t.Fatalf("volume %s: ConfigMap %s with items %v; the test has ConfigMap %s, every file", name, v.ConfigMap.Name, v.ConfigMap.Items, ds.configMap.Name)
			}
			dir := t.TempDir()
			for file, content := range ds.configMap.Data {
				if file == "config.conf" {
					content = withSettings(t, content, map[string]any{
						"mode": m.proxyMode, "clusterCIDR": e.w.ClusterCIDR(),
						"conntrack": map[string]any{"maxPerCore": 0},
					})
				}
				if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			p.folders[name] = dir
		case v.EmptyDir != nil:
			// The folder of e's status socket (0755, as a kubelet's
			// pod folder), where the tmpfs goes.
			dir := filepath.Dir(e.socket)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			p.folders[name] = dir
		case v.HostPath != nil:
			p.folders[name] = v.HostPath.Path
		default:
			t.Fatalf("volume %s: the test emulates configMap, emptyDir and hostPath volumes only: %+v", name, v.VolumeSource)
		}
	}
	p.statusSocket = p.path(ds.proxy, statusapi.DefaultSocket)
	if p.statusSocket == statusapi.DefaultSocket {
		t.Fatalf("kp's default status socket %s is in none of the proxy container's volumes", statusapi.DefaultSocket)
	}
	// kp's own flags the test adds: its source, and its default socket
	// where the test mounts the emptyDir.
	p.proxy.Command = append(slices.Clone(p.proxy.Command), "--manifests", string(e.dir), "--status-socket", p.statusSocket)
	return p
}

// path is a path inside container c, turned into the test's: under a
// volume's mountPath, the volume's folder.
func (p *dsPod) path(c v1.Container, inside string) string {
	for _, vm := range c.VolumeMounts {
		if rest, ok := strings.CutPrefix(inside, vm.MountPath); ok && (rest == "" || rest[0] == '/') {
			return p.folders[vm.Name] + rest
		}
	}
	return inside
}

// start runs container c in the node namespace.
func (p *dsPod) start(c v1.Container) *netns.Process {
	p.t.Helper()
	argv := p.argv(c)
	return p.e.w.StartInNode(p.t, argv[0], argv[1:]...)
}

// argv is the command that runs container c as a container runtime would:
// in a mount namespace of its own with c's volumes mounted and its root
// read-only, with c's capabilities (setpriv), its command's image path,
// mountPaths and $(VARS) made the test's.
func (p *dsPod) argv(c v1.Container) []string {
	t := p.t
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("container %s has no securityContext", c.Name)
	}
	privileged := sc.Privileged != nil && *sc.Privileged
	readOnlyRoot := sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	// Every field the test does not emulate must be unset (or say what
	// the emulation already is): a new one fails here, not silently.
	rest := sc.DeepCopy()
	rest.Privileged, rest.ReadOnlyRootFilesystem, rest.AllowPrivilegeEscalation, rest.Capabilities = nil, nil, nil, nil
	if rest.RunAsUser != nil && *rest.RunAsUser == 0 {
		rest.RunAsUser = nil // the test runs as root
	}
	if rest.SeccompProfile != nil && rest.SeccompProfile.Type == v1.SeccompProfileTypeRuntimeDefault {
		rest.SeccompProfile = nil // not emulated: see the top of this file
	}
	if !equality.Semantic.DeepEqual(*rest, v1.SecurityContext{}) {
		t.Fatalf("container %s: securityContext fields the test does not emulate: %+v", c.Name, rest)
	}

	// The volumes, as the kubelet mounts them, and the mounts left
	// writable under a read-only root.
	var setup []string
	keep := []string{"/proc", "/proc/*", "/dev", "/dev/*"}
	if privileged {
		keep = append(keep, "/sys", "/sys/*")
	}
	for _, vm := range c.VolumeMounts {
		v, dir := p.ds.volumes[vm.Name], p.folders[vm.Name]
		switch {
		case v.ConfigMap != nil:
			if !vm.ReadOnly {
				t.Fatalf("container %s mounts ConfigMap volume %s writable", c.Name, vm.Name)
			}
		case v.EmptyDir != nil:
			size := ""
			if v.EmptyDir.SizeLimit != nil {
				size = ",size=" + strconv.FormatInt(v.EmptyDir.SizeLimit.Value(), 10)
			}
			if v.EmptyDir.Medium != v1.StorageMediumMemory {
				t.Fatalf("volume %s: the test emulates an emptyDir of medium Memory (a tmpfs) only", vm.Name)
			}
			setup = append(setup, fmt.Sprintf("mount -t tmpfs -o mode=0755%s %s %s", size, vm.Name, shellQuote(dir)))
			keep = append(keep, dir)
		case v.HostPath != nil:
			if vm.MountPath != v.HostPath.Path {
				t.Fatalf("volume %s: the test emulates a hostPath mounted at its own path only (%s at %s)", vm.Name, v.HostPath.Path, vm.MountPath)
			}
			if v.HostPath.Type == nil || *v.HostPath.Type != v1.HostPathFileOrCreate {
				t.Fatalf("volume %s: the test emulates a hostPath of type FileOrCreate only", vm.Name)
			}
			setup = append(setup, fmt.Sprintf("[ -e %[1]s ] || : >> %[1]s", shellQuote(dir)),
				fmt.Sprintf("mount --bind %[1]s %[1]s", shellQuote(dir)))
			if !vm.ReadOnly {
				keep = append(keep, dir)
			}
		}
	}
	var script []string
	script = append(script, "set -e")
	script = append(script, setup...)
	// A mount whose mount point the host removed meanwhile (another
	// test's namespace file, say) is out of reach anyway.
	readOnly := `mount -o remount,bind,ro "$m" || [ ! -e "$m" ]`
	if readOnlyRoot {
		script = append(script, `for m in $(findmnt -rno TARGET); do case "$m" in `+strings.Join(quoteEach(keep), "|")+
			`) ;; *) `+readOnly+` ;; esac; done`)
	} else if !privileged {
		script = append(script, `for m in $(findmnt -rno TARGET); do case "$m" in /sys|/sys/*) `+readOnly+` ;; esac; done`)
	}
	if !privileged {
		script = append(script, "mount --bind /proc/sys /proc/sys", "mount -o remount,bind,ro /proc/sys")
	}
	exec := `exec "$@"`
	if !privileged {
		exec = `exec setpriv ` + strings.Join(p.setprivArgs(c), " ") + ` -- "$@"`
	}
	script = append(script, exec)

	cmd := slices.Concat(c.Command, c.Args)
	if len(cmd) == 0 || filepath.Base(cmd[0]) != "kp" {
		t.Fatalf("container %s runs %q, not kp", c.Name, cmd)
	}
	cmd[0] = p.kp
	for i, a := range cmd[1:] {
		a = p.expand(c, a)
		for _, vm := range c.VolumeMounts {
			if p.ds.volumes[vm.Name].HostPath == nil {
				a = strings.ReplaceAll(a, vm.MountPath+"/", p.folders[vm.Name]+"/")
			}
		}
		cmd[i+1] = a
	}
	return append([]string{"unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", strings.Join(script, "\n"), "sh"}, cmd...)
}

// setprivArgs are the setpriv flags of container c's capabilities and
// allowPrivilegeEscalation: its bounding set is its add list (drop ALL),
// nothing inheritable, so root's exec holds exactly those.
func (p *dsPod) setprivArgs(c v1.Container) []string {
	sc := c.SecurityContext
	caps := sc.Capabilities
	if caps == nil || !slices.Equal(caps.Drop, []v1.Capability{"ALL"}) {
		p.t.Fatalf("container %s: capabilities %+v; the test emulates drop: [ALL] and an add list", c.Name, caps)
	}
	bounding := "-all"
	for _, a := range caps.Add {
		bounding += ",+" + strings.ToLower(string(a))
	}
	args := []string{"--inh-caps=-all", "--bounding-set=" + bounding}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--no-new-privs")
	}
	return args
}

// expand replaces $(VAR) in a by container c's env, as the kubelet does:
// a value, or the node's name for fieldRef spec.nodeName.
func (p *dsPod) expand(c v1.Container, a string) string {
	for _, env := range c.Env {
		value := env.Value
		if env.ValueFrom != nil {
			if env.ValueFrom.FieldRef == nil || env.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
				p.t.Fatalf("container %s: env %s from %+v; the test knows spec.nodeName only", c.Name, env.Name, env.ValueFrom)
			}
			value = nodeName
		}
		a = strings.ReplaceAll(a, "$("+env.Name+")", value)
	}
	if strings.Contains(a, "$(") {
		p.t.Fatalf("container %s: %q names a variable the test does not set", c.Name, a)
	}
	return a
}

// checkConfinement checks that the process pid runs as the proxy container
// would: its bounding and effective capabilities exactly the add list, none
// inheritable, no_new_privs as allowPrivilegeEscalation says, /proc/sys
// and (readOnlyRootFilesystem) its root read-only. It proves the emulation
// happened, not kp.
func (p *dsPod) checkConfinement(pid int) {
	t := p.t
	t.Helper()
	names, err := p.e.w.Exec(p.e.w.Node(), "setpriv", "--list-caps")
	if err != nil {
		t.Fatal(err)
	}
	number := map[string]int{}
	for i, n := range strings.Fields(names) {
		number[n] = i // setpriv lists the capabilities by number
	}
	var want uint64
	for _, a := range p.proxy.SecurityContext.Capabilities.Add {
		n, ok := number[strings.ToLower(string(a))]
		if !ok {
			t.Fatalf("capability %s: setpriv does not know it", a)
		}
		want |= 1 << n
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `:\s*(\S+)$`).FindSubmatch(status)
		if m == nil {
			t.Fatalf("/proc/%d/status has no %s", pid, name)
		}
		return string(m[1])
	}
	for name, w := range map[string]uint64{"CapBnd": want, "CapEff": want, "CapPrm": want, "CapInh": 0} {
		if got, err := strconv.ParseUint(field(name), 16, 64); err != nil || got != w {
			t.Errorf("kp's %s = %s, want %016x", name, field(name), w)
		}
	}
	sc := p.proxy.SecurityContext
	if nnp := sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation; (field("NoNewPrivs") == "1") != nnp {
		t.Errorf("kp's NoNewPrivs = %s; allowPrivilegeEscalation: %v", field("NoNewPrivs"), !nnp)
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	readOnly := []string{"/proc/sys"}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		readOnly = append(readOnly, "/", "/tmp", filepath.Dir(p.kp))
	}
	for _, mp := range readOnly {
		if !readOnlyIn(string(mounts), mp) {
			t.Errorf("%s is writable in kp's mount namespace", mp)
		}
	}
	if readOnlyIn(string(mounts), filepath.Dir(p.statusSocket)) {
		t.Errorf("the emptyDir %s is read-only in kp's mount namespace", filepath.Dir(p.statusSocket))
	}
}

// readOnlyIn reports whether path is on a read-only mount in mountinfo:
// the last mount (the top one) whose mount point is path or its nearest
// parent.
func readOnlyIn(mountinfo, path string) bool {
	best, ro := "", false
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		mp := f[4]
		if (path == mp || mp == "/" || strings.HasPrefix(path, mp+"/")) && len(mp) >= len(best) {
			best, ro = mp, slices.Contains(strings.Split(f[5], ","), "ro")
		}
	}
	return ro
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func quoteEach(list []string) []string {
	out := make([]string, len(list))
	for i, s := range list {
		if strings.HasSuffix(s, "/*") {
			out[i] = shellQuote(strings.TrimSuffix(s, "*")) + "*"
		} else {
			out[i] = shellQuote(s)
		}
	}
	return out
}
