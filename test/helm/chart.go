// Package helm lints, renders and packages kp's Helm chart (charts/kp)
// through Helm's own Go module, as the helm CLI does: helm lint --strict,
// helm template (helm install's client-only dry run) and helm package. The
// chart's tests use it, the real-node test renders the chart with it
// (cmd/kp-chart), and a release packages the chart with it (Package).
package helm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
)

// Namespace is where the chart installs (it refuses any other) and
// ReleaseName the README's release name (the objects are named kp
// whatever it is).
const (
	Namespace   = "kube-system"
	ReleaseName = "kp"
)

// RepoRoot is the repository holding the working directory: the closest
// folder up from it whose go.mod is kp's.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(mod), "module github.com/kpproxy/kp\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not in kp's repository: no go.mod of github.com/kpproxy/kp above the working directory")
		}
		dir = parent
	}
}

// ChartDir is charts/kp in the repository holding the working directory.
func ChartDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "charts", "kp"), nil
}

// Values are helm's --set, --set-string and --set-file flags (the
// values' paths in key=value form), merged as helm merges them; files are
// read from the working directory.
type Values struct {
	Set, SetString, SetFile []string
}

// String is v as helm's flags.
func (v Values) String() string {
	var args []string
	for _, f := range []struct {
		flag string
		vals []string
	}{{"--set", v.Set}, {"--set-string", v.SetString}, {"--set-file", v.SetFile}} {
		for _, s := range f.vals {
			args = append(args, f.flag+" "+s)
		}
	}
	if len(args) == 0 {
		return "(the defaults)"
	}
	return strings.Join(args, " ")
}

// Map is v as the map helm renders with (over the chart's values.yaml).
func (v Values) Map() (map[string]any, error) {
	opts := values.Options{Values: v.Set, StringValues: v.SetString, FileValues: v.SetFile}
	return opts.MergeValues(getter.Providers{})
}

// Render is helm template: the chart in dir (a folder or a packaged
// archive) rendered, as helm install would install it into namespace with
// vals over its values.yaml (the values schema applies), as YAML documents
// separated by ---.
func Render(dir, namespace string, vals map[string]any) (string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load chart %s: %w", dir, err)
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = ReleaseName
	install.Namespace = namespace
	install.Replace = true // no release store to check the name against
	r, err := install.Run(ch, vals)
	if err != nil {
		return "", fmt.Errorf("render chart %s: %w", dir, err)
	}
	rel, ok := r.(*releasev1.Release)
	if !ok {
		return "", fmt.Errorf("render chart %s: a release of type %T", dir, r)
	}
	return rel.Manifest, nil
}

// Lint is helm lint --strict of the chart in dir with vals, as installed
// into Namespace: an error holds every message of severity warning and
// above.
func Lint(dir string, vals map[string]any) error {
	l := action.NewLint()
	l.Strict = true
	l.Namespace = Namespace
	res := l.Run([]string{dir}, vals)
	if len(res.Errors) == 0 {
		return nil
	}
	var msgs []string
	for _, e := range res.Errors {
		msgs = append(msgs, e.Error())
	}
	return fmt.Errorf("helm lint --strict %s: %s", dir, strings.Join(msgs, "; "))
}

// PackageOptions are what a release sets in the packaged chart; empty
// fields leave the chart's own.
type PackageOptions struct {
	// Version and AppVersion replace Chart.yaml's (helm package --version
	// --app-version); the image's tag defaults to AppVersion.
	Version, AppVersion string
	// ImageRepository and ImageDigest replace values.yaml's image
	// defaults (the digest wins over the tag): a release pins the image it
	// built.
	ImageRepository, ImageDigest string
	// ModTime is every file's time in the archive, so that the same chart
	// gives the same bytes; zero keeps helm's (the files' times).
	ModTime time.Time
}

// Package is helm package: the chart in dir archived into dest as
// kp-VERSION.tgz, with o's changes; it returns the archive's path.
func Package(dir, dest string, o PackageOptions) (string, error) {
	ch, err := loader.LoadDir(dir)
	if err != nil {
		return "", fmt.Errorf("load chart %s: %w", dir, err)
	}
	if o.Version != "" {
		ch.Metadata.Version = o.Version
	}
	if o.AppVersion != "" {
		ch.Metadata.AppVersion = o.AppVersion
	}
	if err := setImage(ch, o.ImageRepository, o.ImageDigest); err != nil {
		return "", fmt.Errorf("package chart %s: %w", dir, err)
	}
	if !o.ModTime.IsZero() {
		ch.ModTime, ch.SchemaModTime = o.ModTime, o.ModTime
		for _, files := range [][]*common.File{ch.Raw, ch.Templates, ch.Files} {
			for _, f := range files {
				f.ModTime = o.ModTime
			}
		}
	}
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return "", err
	}
	path, err := chartutil.Save(ch, dest)
	if err != nil {
		return "", fmt.Errorf("package chart %s into %s: %w", dir, dest, err)
	}
	return path, nil
}

// setImage writes repository and digest, when set, into the text of the
// chart's values.yaml (the archive holds that text, comments and all) and
// into its values.
func setImage(ch *chartv2.Chart, repository, digest string) error {
	for _, f := range ch.Raw {
		if f.Name != chartutil.ValuesfileName {
			continue
		}
		text := string(f.Data)
		for _, kv := range [][2]string{{"repository", repository}, {"digest", digest}} {
			if kv[1] == "" {
				continue
			}
			re := regexp.MustCompile(`(?m)^  ` + kv[0] + `: .*$`)
			if n := len(re.FindAllStringIndex(text, -1)); n != 1 {
				return fmt.Errorf("values.yaml: %d lines \"  %s: ...\" under image:, want 1", n, kv[0])
			}
			text = re.ReplaceAllLiteralString(text, "  "+kv[0]+": "+strconv.Quote(kv[1]))
			image, ok := ch.Values["image"].(map[string]any)
			if !ok {
				return errors.New("values.yaml: no image:")
			}
			image[kv[0]] = kv[1]
		}
		f.Data = []byte(text)
		return nil
	}
	return errors.New("no values.yaml")
}
