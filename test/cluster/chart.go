package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kpproxy/kp/test/netns"
)

// readmeInstall is how the README's install section starts its Helm
// install; KPChart follows that command.
const readmeInstall = "helm install kp ./charts/kp "

// KPChartBuild builds test/helm's kp-chart (helm template through Helm's
// Go module) once per test process and returns its path; a test may call
// it early, in the background, to have it ready when KPChart needs it.
func KPChartBuild() (string, error) { return netns.BuildNested("test/helm", "./cmd/kp-chart") }

// KPChart renders charts/kp as the README's install section installs it:
// its helm install command, each of its --set values replaced by this
// cluster's (the API server's address, the pod range, the image
// kp.local/kp:imageTag), and conntrack.maxPerCore=0 added, as KPOverlay
// sets it (a node here is a network namespace, where the kernel lets only
// the initial one size the conntrack table); opts as KPOverlay's. It fails
// when the README's command sets a value this cluster has none for, or
// leaves one out. It returns the file of the rendered objects, for kubectl
// apply -f.
func (c *Cluster) KPChart(imageTag string, opts ...KPOption) (string, error) {
	var o kpOverlay
	for _, opt := range opts {
		opt(&o)
	}
	root, err := netns.ModuleRoot()
	if err != nil {
		return "", err
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		return "", err
	}
	argv, err := chartArgs(string(readme), map[string]string{
		"apiServer":        "https://" + c.API.Instance(0).Addr.String(),
		"clusterCIDR":      c.ClusterCIDR.String(),
		"image.repository": "kp.local/kp",
		"image.tag":        imageTag,
	}, o)
	if err != nil {
		return "", err
	}
	bin, err := KPChartBuild()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, argv...)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("kp-chart %s: %w\n%s", strings.Join(argv, " "), err, stderr.String())
	}
	f, err := os.CreateTemp(c.dir, "kp-chart-*.yaml")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Write(out); err != nil {
		return "", err
	}
	return f.Name(), f.Close()
}

// chartArgs are kp-chart's arguments for the README's helm install with
// ours in place of the values it sets (each must be set there, and nothing
// else), conntrack.maxPerCore=0, and o's mode and flags.
func chartArgs(readme string, ours map[string]string, o kpOverlay) ([]string, error) {
	args, err := readmeHelmInstall(readme)
	if err != nil {
		return nil, err
	}
	argv := []string{"template", "kp", "./charts/kp"}
	var set []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--namespace", "-n":
			if i+1 == len(args) {
				return nil, fmt.Errorf("README.md's helm install: %s without its value", args[i])
			}
			argv = append(argv, "--namespace", args[i+1])
			i++
		case "--set":
			if i+1 == len(args) {
				return nil, fmt.Errorf("README.md's helm install: --set without its value")
			}
			key, _, _ := strings.Cut(args[i+1], "=")
			v, ok := ours[key]
			if !ok {
				return nil, fmt.Errorf("README.md's helm install sets %s: the real-node test has no value of its cluster for it", key)
			}
			argv = append(argv, "--set", key+"="+strings.ReplaceAll(v, ",", `\,`))
			set = append(set, key)
			i++
		default:
			return nil, fmt.Errorf("README.md's helm install: %q: the real-node test follows --namespace and --set only", args[i])
		}
	}
	for key := range ours {
		if !slices.Contains(set, key) {
			return nil, fmt.Errorf("README.md's helm install does not set %s, which the real-node test's cluster needs", key)
		}
	}
	argv = append(argv, "--set", "conntrack.maxPerCore=0")
	if o.mode != "" {
		argv = append(argv, "--set", "mode="+o.mode)
	}
	for i, a := range o.args {
		argv = append(argv, "--set", fmt.Sprintf("extraArgs[%d]=%s", i, strings.ReplaceAll(a, ",", `\,`)))
	}
	return argv, nil
}

// readmeHelmInstall returns the arguments of the README's helm install
// after the chart, its lines joined where they end with a backslash.
func readmeHelmInstall(readme string) ([]string, error) {
	_, rest, ok := strings.Cut(readme, "\n"+readmeInstall)
	if !ok {
		return nil, fmt.Errorf("README.md has no line starting %q", readmeInstall)
	}
	var line string
	for _, l := range strings.Split(rest, "\n") {
		cont, more := strings.CutSuffix(l, `\`)
		line += " " + cont
		if !more {
			break
		}
	}
	return strings.Fields(line), nil
}
