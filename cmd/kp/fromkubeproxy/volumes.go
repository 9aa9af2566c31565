package fromkubeproxy

import (
	"path"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// configMapFile says which ConfigMap key the file at p inside container c
// of a pod (spec) is: the mount that holds p, its volume's ConfigMap (a
// configMap volume, or a projected volume's configMap source), and the key
// (items map keys to paths; a subPath mount is one key). ok is false when
// p is in no ConfigMap (a hostPath, a Secret, the image).
func configMapFile(spec *v1.PodSpec, c *v1.Container, p string) (name, key string, ok bool) {
	p = path.Clean(p)
	for _, m := range c.VolumeMounts {
		mount := path.Clean(m.MountPath)
		var rel string
		switch {
		case m.SubPath != "" && p == mount:
			rel = m.SubPath
		case m.SubPath == "" && strings.HasPrefix(p, mount+"/"):
			rel = strings.TrimPrefix(p, mount+"/")
		default:
			continue
		}
		for _, vol := range spec.Volumes {
			if vol.Name != m.Name {
				continue
			}
			if cm := vol.ConfigMap; cm != nil {
				if k, ok := keyOf(cm.Items, rel); ok {
					return cm.Name, k, true
				}
			}
			if pv := vol.Projected; pv != nil {
				for _, src := range pv.Sources {
					if cm := src.ConfigMap; cm != nil {
						// Without items, the first ConfigMap is taken to
						// hold the file: its keys cannot be told apart here.
						if k, ok := keyOf(cm.Items, rel); ok {
							return cm.Name, k, true
						}
					}
				}
			}
		}
	}
	return "", "", false
}

// keyOf is the key a volume's items put at rel; without items every key
// is a file of its own name (no subfolders).
func keyOf(items []v1.KeyToPath, rel string) (string, bool) {
	if len(items) == 0 {
		return rel, !strings.Contains(rel, "/")
	}
	for _, it := range items {
		if path.Clean(it.Path) == rel {
			return it.Key, true
		}
	}
	return "", false
}

// containerArgs is what a container runs the program with (its arguments,
// without the program), and the program's base name: the command then the
// args; with no command, the image's entrypoint gets the args. A shell
// (sh -c "kube-proxy --config=...") is split on white space.
func containerArgs(c *v1.Container) (program string, args []string) {
	all := append(append([]string(nil), c.Command...), c.Args...)
	if len(c.Command) == 0 {
		return "", all
	}
	if len(all) >= 3 && (filepath.Base(all[0]) == "sh" || filepath.Base(all[0]) == "bash") && all[1] == "-c" {
		all = strings.Fields(all[2])
		if len(all) == 0 {
			return "", nil
		}
	}
	return filepath.Base(all[0]), all[1:]
}

// container is the pod's container named name, else its first.
func container(spec *v1.PodSpec, name string) *v1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	if len(spec.Containers) == 0 {
		return nil
	}
	return &spec.Containers[0]
}
