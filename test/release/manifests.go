package release

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// kustomization is the part of kustomize's Kustomization that manifests/
// uses. renderKustomization refuses any other field, so a change there
// fails the release instead of shipping manifests that differ from what
// `kubectl apply -k manifests/` applies.
type kustomization struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Namespace  string            `json:"namespace"`
	Resources  []string          `json:"resources"`
	Images     []kustomizeImage  `json:"images"`
	Labels     []kustomizeLabels `json:"labels"`
}

type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
	Digest  string `json:"digest"`
}

type kustomizeLabels struct {
	Pairs            map[string]string `json:"pairs"`
	IncludeSelectors bool              `json:"includeSelectors"`
	IncludeTemplates bool              `json:"includeTemplates"`
}

// Kinds renderKustomization knows the scope of: the namespace transformer
// sets metadata.namespace on the namespaced ones only.
var (
	namespacedKinds    = []string{"ServiceAccount", "ConfigMap", "DaemonSet", "Role", "RoleBinding", "Service", "Secret"}
	clusterScopedKinds = []string{"ClusterRole", "ClusterRoleBinding", "Namespace"}
)

// renderKustomization renders the kustomization in dir as `kubectl
// kustomize` does (its namespace, labels and images transformers, over
// plain resource files), with pin in place of the images entry for the
// image named pin.Name. It returns one YAML stream, the objects in the
// kustomization's resource order.
func renderKustomization(dir string, pin kustomizeImage) ([]byte, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, fmt.Errorf("manifests: %w", err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		return nil, fmt.Errorf("manifests: %s/kustomization.yaml uses what the release's renderer does not do (test/release/manifests.go): %w", dir, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("manifests: %s/kustomization.yaml is %s %s, want kustomize.config.k8s.io/v1beta1 Kustomization", dir, k.APIVersion, k.Kind)
	}
	images := slices.Clone(k.Images)
	if i := slices.IndexFunc(images, func(im kustomizeImage) bool { return im.Name == pin.Name }); i >= 0 {
		images[i] = pin
	} else {
		return nil, fmt.Errorf("manifests: %s/kustomization.yaml sets no image %q to pin", dir, pin.Name)
	}
	var out bytes.Buffer
	for _, res := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, res))
		if err != nil {
			return nil, fmt.Errorf("manifests: resource %s: %w (only files are rendered)", res, err)
		}
		for i, doc := range splitYAML(b) {
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				return nil, fmt.Errorf("manifests: %s, document %d: %w", res, i, err)
			}
			if obj == nil {
				continue
			}
			if err := transform(obj, k, images); err != nil {
				return nil, fmt.Errorf("manifests: %s, document %d: %w", res, i, err)
			}
			y, err := yaml.Marshal(obj)
			if err != nil {
				return nil, err
			}
			out.WriteString("---\n")
			out.Write(y)
		}
	}
	return out.Bytes(), nil
}

// splitYAML cuts a YAML stream at its document separators.
func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	var cur []string
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if strings.TrimRight(line, " \r\n") == "---" {
			docs = append(docs, []byte(strings.Join(cur, "")))
			cur = nil
			continue
		}
		cur = append(cur, line)
	}
	return append(docs, []byte(strings.Join(cur, "")))
}

// transform applies k's namespace and labels and images to obj.
func transform(obj map[string]any, k kustomization, images []kustomizeImage) error {
	kind, _ := obj["kind"].(string)
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		return fmt.Errorf("%s without metadata", kind)
	}
	if k.Namespace != "" {
		switch {
		case slices.Contains(namespacedKinds, kind):
			meta["namespace"] = k.Namespace
		case slices.Contains(clusterScopedKinds, kind):
		default:
			return fmt.Errorf("kind %s: the renderer does not know whether it is namespaced (test/release/manifests.go)", kind)
		}
	}
	// kustomize's default (setRoleBindingSubjects: defaultOnly) moves a
	// binding's subjects in the default namespace into k.Namespace; the
	// renderer does not, and refuses such a subject.
	if subjects, ok := obj["subjects"].([]any); ok {
		for _, s := range subjects {
			if sm, _ := s.(map[string]any); sm["kind"] == "ServiceAccount" && (sm["namespace"] == nil || sm["namespace"] == "default") {
				return fmt.Errorf("%s: a ServiceAccount subject in the default namespace (kustomize would move it; name its namespace)", kind)
			}
		}
	}
	for _, l := range k.Labels {
		if l.IncludeSelectors || l.IncludeTemplates {
			return fmt.Errorf("labels with includeSelectors or includeTemplates: the renderer sets metadata.labels only")
		}
		labels, _ := meta["labels"].(map[string]any)
		if labels == nil {
			labels = map[string]any{}
		}
		for key, v := range l.Pairs {
			labels[key] = v
		}
		meta["labels"] = labels
	}
	setImages(obj, images)
	return nil
}

// setImages rewrites the image of every container and init container
// under v that an images entry names, as kustomize's images transformer
// does: newName replaces the name; a digest replaces tag and digest, else
// newTag replaces the tag.
func setImages(v any, images []kustomizeImage) {
	switch v := v.(type) {
	case map[string]any:
		for key, child := range v {
			if key == "containers" || key == "initContainers" {
				list, _ := child.([]any)
				for _, c := range list {
					if cm, ok := c.(map[string]any); ok {
						if img, ok := cm["image"].(string); ok {
							cm["image"] = setImage(img, images)
						}
					}
				}
			}
			setImages(child, images)
		}
	case []any:
		for _, child := range v {
			setImages(child, images)
		}
	}
}

func setImage(img string, images []kustomizeImage) string {
	name, digest, _ := strings.Cut(img, "@")
	tag := ""
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name, tag = name[:i], name[i+1:]
	}
	for _, im := range images {
		if im.Name != name {
			continue
		}
		if im.NewName != "" {
			name = im.NewName
		}
		switch {
		case im.Digest != "":
			return name + "@" + im.Digest
		case im.NewTag != "":
			return name + ":" + im.NewTag
		}
		break
	}
	switch {
	case digest != "" && tag != "":
		return name + ":" + tag + "@" + digest
	case digest != "":
		return name + "@" + digest
	case tag != "":
		return name + ":" + tag
	}
	return name
}
