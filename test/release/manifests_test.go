package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// objects parses a YAML stream into its objects.
func objects(t *testing.T, stream []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for i, doc := range splitYAML(stream) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		if obj != nil {
			out = append(out, obj)
		}
	}
	return out
}

// imagesIn lists the image of every container and init container in a
// YAML stream of objects.
func imagesIn(t *testing.T, stream []byte) []string {
	t.Helper()
	var images []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, key := range []string{"initContainers", "containers"} {
				if list, ok := v[key].([]any); ok {
					for _, c := range list {
						if img, ok := c.(map[string]any)["image"].(string); ok {
							images = append(images, img)
						}
					}
				}
			}
			for key, child := range v {
				if key != "containers" && key != "initContainers" {
					walk(child)
				}
			}
		case []any:
			for _, child := range v {
				walk(child)
			}
		}
	}
	for _, o := range objects(t, stream) {
		walk(o)
	}
	return images
}

func manifestsDir(t *testing.T) string {
	t.Helper()
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "manifests")
}

// The release's manifests are what kubectl kustomize (v1.36, kustomize v5)
// renders from manifests/ with the image set to the digest: the same
// objects, field for field.
func TestRenderedManifestsAreWhatKubectlKustomizeRenders(t *testing.T) {
	kubectl := apiserver.Bin(t, apiserver.Kubectl)
	dir := manifestsDir(t)
	const repo = "registry.example/kp"
	ours, err := renderKustomization(dir, kustomizeImage{Name: "kp", NewName: repo, Digest: testDigest})
	if err != nil {
		t.Fatal(err)
	}

	// kubectl's: a copy of manifests/ whose kustomization sets the image
	// by digest, as `kustomize edit set image kp=repo@digest` would.
	tmp := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() == "kustomization.yaml" {
				var k map[string]any
				if err := yaml.Unmarshal(b, &k); err != nil {
					t.Fatal(err)
				}
				k["images"] = []any{map[string]any{"name": "kp", "newName": repo, "digest": testDigest}}
				if b, err = yaml.Marshal(k); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(tmp, e.Name()), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	theirs, err := exec.Command(kubectl, "kustomize", tmp).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	a, b := objects(t, ours), objects(t, theirs)
	if len(a) != len(b) {
		t.Fatalf("%d objects rendered, kubectl kustomize renders %d:\n%s", len(a), len(b), theirs)
	}
	key := func(o map[string]any) string {
		meta, _ := o["metadata"].(map[string]any)
		return o["kind"].(string) + "/" + meta["name"].(string)
	}
	byKey := map[string]map[string]any{}
	for _, o := range b {
		byKey[key(o)] = o
	}
	for _, o := range a {
		if want, ok := byKey[key(o)]; !ok {
			t.Errorf("%s rendered, not by kubectl kustomize", key(o))
		} else if !reflect.DeepEqual(o, want) {
			got, _ := yaml.Marshal(o)
			w, _ := yaml.Marshal(want)
			t.Errorf("%s differs from kubectl kustomize's:\nours:\n%s\nkubectl's:\n%s", key(o), got, w)
		}
	}
	if imgs := imagesIn(t, ours); len(imgs) != 2 || imgs[0] != repo+"@"+testDigest || imgs[1] != imgs[0] {
		t.Errorf("images %q, want both containers on %s@%s", imgs, repo, testDigest)
	}
}

// What the renderer does not do, it refuses, rather than render manifests
// that differ from what kubectl apply -k would apply.
func TestRendererRefusesWhatItDoesNotRender(t *testing.T) {
	for _, tc := range []struct{ name, kustomization, resource, want string }{
		{"a patch", "patches:\n  - path: p.yaml\n", "", "does not do"},
		{"a remote resource", "", "", "only files"},
		{"an unknown kind", "", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n", "kind Pod"},
		{"a binding to the default namespace", "", "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: x\nsubjects:\n  - kind: ServiceAccount\n    name: kp\n", "default namespace"},
		{"labels on selectors", "labels:\n  - pairs: {a: b}\n    includeSelectors: true\n", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n", "includeSelectors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			res := "r.yaml"
			if tc.name == "a remote resource" {
				res = "https://example.com/x.yaml"
			} else if err := os.WriteFile(filepath.Join(dir, res), []byte(tc.resource), 0o644); err != nil {
				t.Fatal(err)
			}
			k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: kube-system\nresources:\n  - " + res +
				"\nimages:\n  - name: kp\n    newName: x/kp\n" + tc.kustomization
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := renderKustomization(dir, kustomizeImage{Name: "kp", NewName: "x/kp", Digest: testDigest})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
