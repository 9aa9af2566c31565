package helm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// objects are decoded Kubernetes objects by "Kind/name".
type objects map[string]map[string]any

// decode reads YAML documents (helm's output, kustomize's) into objects;
// empty documents (helm's comments-only ones) are skipped.
func decode(t *testing.T, text string) objects {
	t.Helper()
	out := objects{}
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(text), 4096)
	for {
		var obj map[string]any
		err := d.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decode: %v\n%s", err, text)
		}
		if obj == nil {
			continue
		}
		meta, _ := obj["metadata"].(map[string]any)
		key := fmt.Sprintf("%v/%v", obj["kind"], meta["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s twice", key)
		}
		out[key] = obj
	}
}

// kustomize renders a kustomization as kubectl apply -k does (kubectl
// v1.36 builds with this kustomize, sigs.k8s.io/kustomize/api v0.21).
func kustomize(t *testing.T, dir string) objects {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	text, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, string(text))
}

// render renders the repository's chart with values (helm's --set forms)
// into kube-system.
func render(t *testing.T, v Values) objects {
	t.Helper()
	text, err := renderText(v)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, text)
}

func renderText(v Values) (string, error) {
	vals, err := v.Map()
	if err != nil {
		return "", err
	}
	return Render(chartDir(), Namespace, vals)
}

func chartDir() string { return filepath.Join("..", "..", "charts", "kp") }

// files are the ConfigMap's files decoded, for flatten: a change shows
// as the field it changes, not as a whole new text.
var files = []string{"config.conf", "kubeconfig.conf"}

// flatten lists every leaf of objs by its path ("DaemonSet/kp
// spec.template.spec.containers[0].image"), the ConfigMap's files
// decoded (data[config.conf].mode).
func flatten(t *testing.T, objs objects) map[string]any {
	t.Helper()
	out := map[string]any{}
	for key, obj := range objs {
		if obj["kind"] == "ConfigMap" {
			data, _ := obj["data"].(map[string]any)
			obj = copyMap(obj)
			d := copyMap(data)
			obj["data"] = d
			for _, f := range files {
				s, ok := d[f].(string)
				if !ok {
					continue
				}
				var v any
				if err := yaml.Unmarshal([]byte(s), &v); err != nil {
					t.Fatalf("%s data %s: %v\n%s", key, f, err, s)
				}
				d[f] = v
			}
		}
		flattenInto(key+" ", obj, out)
	}
	return out
}

func copyMap(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func flattenInto(path string, v any, out map[string]any) {
	sep := "."
	if strings.HasSuffix(path, " ") {
		sep = ""
	}
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			out[path] = v
		}
		for k, e := range v {
			if slices.Contains(files, k) || strings.ContainsAny(k, "./") {
				flattenInto(path+"["+k+"]", e, out)
			} else {
				flattenInto(path+sep+k, e, out)
			}
		}
	case []any:
		if len(v) == 0 {
			out[path] = v
		}
		for i, e := range v {
			flattenInto(fmt.Sprintf("%s[%d]", path, i), e, out)
		}
	default:
		out[path] = v
	}
}

// removed marks a path that a change takes away.
type removedT struct{}

var removed = removedT{}

// changes is what differs from before to after: each changed or added
// path with its new value, each removed one as removed.
func changes(before, after map[string]any) map[string]any {
	out := map[string]any{}
	for p, v := range after {
		if b, ok := before[p]; !ok || !reflect.DeepEqual(b, v) {
			out[p] = v
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			out[p] = removed
		}
	}
	return out
}

// describe prints changes one a line, sorted, for a failure message.
func describe(m map[string]any) string {
	var b bytes.Buffer
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if m[k] == removed {
			fmt.Fprintf(&b, "\n  %s: (removed)", k)
		} else {
			fmt.Fprintf(&b, "\n  %s: %#v", k, m[k])
		}
	}
	return b.String()
}
