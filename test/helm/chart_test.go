package helm

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
)

// The chart with its default values is manifests/, object for object and
// field for field (comments in the ConfigMap's files included): the two
// ways to install kp cannot drift apart. manifests/ is rendered by
// kustomize, as kubectl apply -k renders it.
func TestChartDefaultsRenderManifests(t *testing.T) {
	want := kustomize(t, filepath.Join("..", "..", "manifests"))
	got := render(t, Values{})
	for key := range want {
		if _, ok := got[key]; !ok {
			t.Errorf("the chart renders no %s; manifests/ has it", key)
		}
	}
	for key := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("the chart renders %s; manifests/ has no such object", key)
		}
	}
	for key, obj := range want {
		if g, ok := got[key]; ok && !reflect.DeepEqual(g, obj) {
			diff := changes(flatten(t, objects{key: obj}), flatten(t, objects{key: g}))
			if len(diff) == 0 {
				diff = map[string]any{key + " (the ConfigMap's files' text: comments or layout)": "differs"}
			}
			t.Errorf("%s: the chart's differs from manifests/' in:%s", key, describe(diff))
		}
	}
}

// Each value changes what it names, and nothing else: the rendered
// objects differ from the defaults' in exactly these paths.
func TestEachValueChangesWhatItShould(t *testing.T) {
	const (
		ds   = "DaemonSet/kp spec.template.spec."
		kp   = ds + "containers[0]."
		init = ds + "initContainers[0]."
		conf = "ConfigMap/kp data[config.conf]."
		kcfg = "ConfigMap/kp data[kubeconfig.conf]."
		term = ds + "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]."
	)
	for _, tc := range []struct {
		name string
		v    Values
		want map[string]any
	}{
		{"mode", Values{Set: []string{"mode=iptables"}}, map[string]any{conf + "mode": "iptables"}},
		{"mode empty: the first that runs", Values{Set: []string{"mode="}}, map[string]any{conf + "mode": ""}},
		{"clusterCIDR, dual-stack (helm needs the comma escaped)", Values{Set: []string{`clusterCIDR=10.244.0.0/16\,fd00:10:244::/56`}},
			map[string]any{conf + "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56"}},
		{"clusterCIDR empty", Values{Set: []string{"clusterCIDR="}}, map[string]any{conf + "clusterCIDR": ""}},
		{"apiServer", Values{Set: []string{"apiServer=https://10.0.0.10:6443"}},
			map[string]any{kcfg + "clusters[0].cluster.server": "https://10.0.0.10:6443"}},
		{"apiServer, IPv6", Values{Set: []string{"apiServer=https://[fd00::10]:6443"}},
			map[string]any{kcfg + "clusters[0].cluster.server": "https://[fd00::10]:6443"}},
		{"conntrack", Values{Set: []string{"conntrack.maxPerCore=0", "conntrack.min=1000000", "conntrack.tcpEstablishedTimeout=2h",
			"conntrack.tcpCloseWaitTimeout=0s"}}, map[string]any{conf + "conntrack.maxPerCore": float64(0), conf + "conntrack.min": float64(1000000),
			conf + "conntrack.tcpEstablishedTimeout": "2h", conf + "conntrack.tcpCloseWaitTimeout": "0s"}},
		{"image repository and tag, in both containers", Values{Set: []string{"image.repository=registry.example/kp", "image.tag=v0.1.0"}},
			map[string]any{kp + "image": "registry.example/kp:v0.1.0", init + "image": "registry.example/kp:v0.1.0"}},
		{"image digest wins over the tag", Values{Set: []string{"image.tag=v0.1.0", "image.digest=sha256:0123456789abcdef"}},
			map[string]any{kp + "image": "ghcr.io/kpproxy/kp@sha256:0123456789abcdef", init + "image": "ghcr.io/kpproxy/kp@sha256:0123456789abcdef"}},
		{"image pull policy", Values{Set: []string{"image.pullPolicy=Never"}},
			map[string]any{kp + "imagePullPolicy": "Never", init + "imagePullPolicy": "Never"}},
		{"extraArgs", Values{Set: []string{"extraArgs={--allow-mode-none}"}}, map[string]any{kp + "command[4]": "--allow-mode-none"}},
		{"resources", Values{Set: []string{"resources.limits.memory=320Mi", "resources.requests.cpu=100m"}},
			map[string]any{kp + "resources.limits.memory": "320Mi", kp + "resources.requests.cpu": "100m"}},
		{"resources removed", Values{Set: []string{"resources=null"}}, map[string]any{kp + "resources.limits.memory": removed,
			kp + "resources.requests.cpu": removed, kp + "resources.requests.memory": removed}},
		{"tolerations replace the default", Values{Set: []string{"tolerations[0].key=node-role.kubernetes.io/control-plane", "tolerations[0].effect=NoSchedule"}},
			map[string]any{ds + "tolerations[0].operator": removed, ds + "tolerations[0].key": "node-role.kubernetes.io/control-plane",
				ds + "tolerations[0].effect": "NoSchedule"}},
		{"nodeSelector adds to the default", Values{Set: []string{"nodeSelector.disktype=ssd"}}, map[string]any{ds + "nodeSelector.disktype": "ssd"}},
		{"nodeSelector removed", Values{Set: []string{"nodeSelector=null"}}, map[string]any{ds + "nodeSelector[kubernetes.io/os]": removed}},
		{"affinity: a required term gets the migration label's expression", Values{Set: []string{
			"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=topology.kubernetes.io/zone",
			"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=In",
			"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values[0]=zone-a"}},
			map[string]any{term + "matchExpressions[0].key": "topology.kubernetes.io/zone", term + "matchExpressions[0].operator": "In",
				term + "matchExpressions[0].values[0]": "zone-a", term + "matchExpressions[1].key": "kpproxy.io/proxy",
				term + "matchExpressions[1].operator": "NotIn", term + "matchExpressions[1].values[0]": "kube-proxy"}},
		{"affinity: another kind stays beside the label's", Values{Set: []string{
			"affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey=kubernetes.io/hostname"}},
			map[string]any{ds + "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey": "kubernetes.io/hostname"}},
		{"migrationLabel off: kp on every node", Values{Set: []string{"migrationLabel=false"}}, map[string]any{
			term + "matchExpressions[0].key": removed, term + "matchExpressions[0].operator": removed, term + "matchExpressions[0].values[0]": removed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defaults := flatten(t, render(t, Values{}))
			got := changes(defaults, flatten(t, render(t, tc.v)))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%v changed:%s\nwant:%s", tc.v, describe(got), describe(tc.want))
			}
		})
	}
}

// config, kubeconfig and fromKubeProxy take the files whole, as given.
func TestWholeFilesReplaceWhatTheValuesWrite(t *testing.T) {
	dir := t.TempDir()
	conf := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n# mine\nmode: ipvs\n\nclusterCIDR: 10.32.0.0/12\n" +
		"clientConnection:\n  kubeconfig: /var/lib/kp/kubeconfig.conf\n"
	kcfg := "apiVersion: v1\nkind: Config\nclusters:\n  - name: default\n    cluster:\n      server: https://api.example:6443\n"
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	confFile, kcfgFile := write("config.conf", conf), write("kubeconfig.conf", kcfg)
	printed, err := os.ReadFile(filepath.Join("testdata", "print-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	printedData := decode(t, string(printed))["ConfigMap/kp"]["data"].(map[string]any)
	defaults := render(t, Values{})["ConfigMap/kp"]["data"].(map[string]any)
	for _, tc := range []struct {
		name             string
		v                Values
		config, kubeconf any
	}{
		{"config", Values{SetFile: []string{"config=" + confFile}, Set: []string{"clusterCIDR=10.0.0.0/8"}}, conf, defaults["kubeconfig.conf"]},
		{"kubeconfig", Values{SetFile: []string{"kubeconfig=" + kcfgFile}}, defaults["config.conf"], kcfg},
		{"fromKubeProxy: kp migrate cluster --from-kube-proxy --print-config's output",
			Values{SetFile: []string{"fromKubeProxy=" + filepath.Join("testdata", "print-config.yaml")}},
			printedData["config.conf"], printedData["kubeconfig.conf"]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := render(t, tc.v)["ConfigMap/kp"]["data"].(map[string]any)
			if data["config.conf"] != tc.config {
				t.Errorf("config.conf:\n%s\nwant:\n%s", data["config.conf"], tc.config)
			}
			if data["kubeconfig.conf"] != tc.kubeconf {
				t.Errorf("kubeconfig.conf:\n%s\nwant:\n%s", data["kubeconfig.conf"], tc.kubeconf)
			}
		})
	}
}

// What the chart refuses, each with a message that says what to do.
func TestChartRefusesWhatCannotWork(t *testing.T) {
	dir := t.TempDir()
	notCM := filepath.Join(dir, "config.conf")
	if err := os.WriteFile(notCM, []byte("kind: KubeProxyConfiguration\nmode: ipvs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	printed := filepath.Join("testdata", "print-config.yaml")
	for _, tc := range []struct {
		name, namespace string
		v               Values
		want            string
	}{
		{"another namespace", "default", Values{}, `kp installs into kube-system`},
		{"a misspelt value", Namespace, Values{Set: []string{"clusterCidr=10.244.0.0/16"}}, "clusterCidr"},
		{"an unknown mode", Namespace, Values{Set: []string{"mode=kernelspace"}}, "mode"},
		{"a digest that is not one", Namespace, Values{Set: []string{"image.digest=latest"}}, "digest"},
		{"an API server without its scheme", Namespace, Values{Set: []string{"apiServer=10.0.0.10:6443"}}, "apiServer"},
		{"fromKubeProxy with config", Namespace, Values{SetFile: []string{"fromKubeProxy=" + printed, "config=" + notCM}}, "leave config and kubeconfig empty"},
		{"fromKubeProxy not a ConfigMap", Namespace, Values{SetFile: []string{"fromKubeProxy=" + notCM}}, "want the ConfigMap kp migrate cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals, err := tc.v.Map()
			if err != nil {
				t.Fatal(err)
			}
			_, err = Render(chartDir(), tc.namespace, vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v into %s: %v, want an error with %q", tc.v, tc.namespace, err, tc.want)
			}
		})
	}
}

// helm lint --strict passes with the defaults, the README's values and
// each whole-file value.
func TestChartLintsClean(t *testing.T) {
	for _, v := range []Values{
		{},
		readmeValues(t),
		{SetFile: []string{"fromKubeProxy=" + filepath.Join("testdata", "print-config.yaml")}},
	} {
		vals, err := v.Map()
		if err != nil {
			t.Fatal(err)
		}
		if err := Lint(chartDir(), vals); err != nil {
			t.Errorf("%v: %v", v, err)
		}
	}
}

// readmeInstall is the README's helm install command: its arguments after
// the chart, its lines joined where they end with a backslash.
func readmeInstall(t *testing.T) []string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const cmd = "helm install kp ./charts/kp "
	_, rest, ok := strings.Cut(string(text), "\n"+cmd)
	if !ok {
		t.Fatalf("README.md has no line starting %q", cmd)
	}
	var line string
	for _, l := range strings.Split(rest, "\n") {
		cont, more := strings.CutSuffix(l, "\\")
		line += " " + cont
		if !more {
			break
		}
	}
	return strings.Fields(line)
}

// readmeValues are the values the README's helm install sets.
func readmeValues(t *testing.T) Values {
	t.Helper()
	args := readmeInstall(t)
	var v Values
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--namespace", "-n":
			i++
			if i >= len(args) || args[i] != Namespace {
				t.Fatalf("README.md's helm install: --namespace must be %s: %q", Namespace, args)
			}
		case "--set":
			i++
			if i < len(args) {
				v.Set = append(v.Set, args[i])
			}
		default:
			if strings.HasPrefix(args[i], "#") {
				return v
			}
			t.Fatalf("README.md's helm install: %q: only --namespace and --set here (the real-node test follows them)", args[i])
		}
	}
	return v
}

// The README's helm install sets exactly what a real cluster must set: the
// API server's address and the pod CIDRs, and the image (none is published
// yet); nothing else. The real-node test, TestKpOnRealNodes, follows the
// same command with the cluster's values.
func TestReadmeInstallSetsTheAPIServerAndClusterCIDR(t *testing.T) {
	v := readmeValues(t)
	got := changes(flatten(t, render(t, Values{})), flatten(t, render(t, v)))
	var paths []string
	for p := range got {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	want := []string{"ConfigMap/kp data[config.conf].clusterCIDR", "ConfigMap/kp data[kubeconfig.conf].clusters[0].cluster.server",
		"DaemonSet/kp spec.template.spec.containers[0].image", "DaemonSet/kp spec.template.spec.initContainers[0].image"}
	if !slices.Equal(paths, want) {
		t.Errorf("README.md's helm install (%s) changes:%s\nwant exactly: %v", v, describe(got), want)
	}
}

// A packaged chart (helm package, what a release ships) renders as the
// folder does with the release's version as the image tag, or its image
// pinned by digest, holds only the chart, and is the same bytes when
// packaged again with the same time.
func TestPackagedChartCarriesTheRelease(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	epoch := time.Unix(0, 0)
	for _, tc := range []struct {
		name string
		o    PackageOptions
		want Values
	}{
		{"version and appVersion", PackageOptions{Version: "0.2.0", AppVersion: "v0.2.0"}, Values{Set: []string{"image.tag=v0.2.0"}}},
		{"the image pinned", PackageOptions{Version: "0.2.0", AppVersion: "v0.2.0", ImageRepository: "registry.example/kp", ImageDigest: digest, ModTime: epoch},
			Values{Set: []string{"image.repository=registry.example/kp", "image.digest=" + digest}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, err := Package(chartDir(), t.TempDir(), tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(path) != "kp-0.2.0.tgz" {
				t.Errorf("archive %s, want kp-0.2.0.tgz", path)
			}
			ch, err := loader.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range ch.Raw {
				if !regexp.MustCompile(`^(Chart\.yaml|values\.yaml|values\.schema\.json|\.helmignore|README\.md|templates/[A-Za-z_]+\.(yaml|tpl|txt))$`).MatchString(f.Name) {
					t.Errorf("the archive holds %s", f.Name)
				}
				if !tc.o.ModTime.IsZero() && !f.ModTime.Equal(tc.o.ModTime) {
					t.Errorf("%s in the archive: time %v, want %v", f.Name, f.ModTime, tc.o.ModTime)
				}
			}
			text, err := Render(path, Namespace, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := decode(t, text), render(t, tc.want); !reflect.DeepEqual(got, want) {
				t.Errorf("the packaged chart renders, against the folder with %s:%s", tc.want, describe(changes(flatten(t, want), flatten(t, got))))
			}
			if tc.o.ModTime.IsZero() {
				return
			}
			again, err := Package(chartDir(), t.TempDir(), tc.o)
			if err != nil {
				t.Fatal(err)
			}
			a, _ := os.ReadFile(path)
			b, _ := os.ReadFile(again)
			if !bytes.Equal(a, b) {
				t.Errorf("packaged twice with the same options and time: %d and %d bytes that differ", len(a), len(b))
			}
		})
	}
}
