package source

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

func TestDirSourceInitialLoad(t *testing.T) {
	tests := []struct {
		name     string
		files    map[string]string
		want     []string
		wantErrs int
	}{
		{
			name: "multi-document YAML loads every object, namespace defaults to default",
			files: map[string]string{
				"web.yaml": "# the web tier\n---\n" + serviceYAML("web", 80) + "---\n" + sliceYAML("web-1", "web") + "---\n",
			},
			want: []string{"EndpointSlice shop/web-1", "Service default/web"},
		},
		{
			name:  "JSON v1 List loads its items",
			files: map[string]string{"api.json": serviceListJSON},
			want:  []string{"EndpointSlice shop/api-1", "Service shop/api"},
		},
		{
			name:  "only this node's Node is passed on",
			files: map[string]string{"nodes.yml": nodeYAML},
			want:  []string{"Node"},
		},
		{
			name: "other kinds are skipped, other files still load",
			files: map[string]string{
				"cm.yaml":      "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n---\n" + serviceYAML("web", 80),
				"db.yaml":      serviceYAML("db", 5432),
				"notes.md":     "not a manifest",
				".hidden.yaml": serviceYAML("hidden", 1),
				"web.yaml~":    serviceYAML("backup", 1),
			},
			want: []string{"Service default/db", "Service default/web"},
		},
		{
			name: "a file that never decoded contributes nothing, others load",
			files: map[string]string{
				"web.yaml": serviceYAML("web", 80) + "---\n" + strings.Replace(serviceYAML("admin", 1), "kind: Service\n", "", 1),
				"db.yaml":  serviceYAML("db", 5432),
			},
			want:     []string{"Service default/db"},
			wantErrs: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				writeFile(t, dir, name, content)
			}
			src, sink, _ := startDirSource(t, dir)
			if got := sink.keys(); !slices.Equal(got, tt.want) {
				t.Errorf("objects = %q, want %q", got, tt.want)
			}
			if errs := src.Errors(); len(errs) != tt.wantErrs {
				t.Errorf("Errors() = %v, want %d", errs, tt.wantErrs)
			}
		})
	}
	t.Run("the proxy's Node carries its labels", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "nodes.yaml", nodeYAML)
		_, sink, _ := startDirSource(t, dir)
		node, _ := sink.object("Node").(*v1.Node)
		if node == nil || node.Name != "node-a" || node.Labels[v1.LabelTopologyZone] != "zone-1" {
			t.Errorf("Node = %+v, want node-a in zone-1", node)
		}
	})
}

func TestDirSourceChanges(t *testing.T) {
	type check func(t *testing.T, src *DirSource, sink *recordingSink, logs *lockedBuffer, before int)
	wantPort := func(key string, port int32) func(*recordingSink) bool {
		return func(s *recordingSink) bool { return s.servicePort(key) == port }
	}
	tests := []struct {
		name   string
		files  map[string]string
		change func(t *testing.T, dir string)
		until  func(*recordingSink) bool
		check  check
	}{
		{
			name: "edited file delivers only the object that changed",
			files: map[string]string{
				"web.yaml": serviceYAML("web", 80) + "---\n" + serviceYAML("admin", 9000),
			},
			change: func(t *testing.T, dir string) {
				writeFile(t, dir, "web.yaml", serviceYAML("web", 8080)+"---\n"+serviceYAML("admin", 9000))
			},
			until: wantPort("Service default/web", 8080),
			check: func(t *testing.T, _ *DirSource, sink *recordingSink, _ *lockedBuffer, before int) {
				if got := sink.callsSince(before); !slices.Equal(got, []string{"set Service default/web"}) {
					t.Errorf("calls after edit = %q, want only the web Service", got)
				}
			},
		},
		{
			name: "removed file delivers deletions",
			files: map[string]string{
				"web.yaml": serviceYAML("web", 80) + "---\n" + sliceYAML("web-1", "web"),
				"db.yaml":  serviceYAML("db", 5432),
			},
			change: func(t *testing.T, dir string) {
				if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
					t.Fatal(err)
				}
			},
			until: func(s *recordingSink) bool { return slices.Equal(s.keys(), []string{"Service default/db"}) },
			check: func(t *testing.T, _ *DirSource, sink *recordingSink, _ *lockedBuffer, before int) {
				got := sink.callsSince(before)
				slices.Sort(got)
				if want := []string{"delete EndpointSlice shop/web-1", "delete Service default/web"}; !slices.Equal(got, want) {
					t.Errorf("calls = %q, want %q", got, want)
				}
			},
		},
		{
			name:  "broken edit keeps the previous content and names file and document",
			files: map[string]string{"web.yaml": serviceYAML("web", 80) + "---\n" + serviceYAML("admin", 9000)},
			change: func(t *testing.T, dir string) {
				broken := strings.Replace(serviceYAML("admin", 9001), "port: 9001", "port: high", 1)
				writeFile(t, dir, "web.yaml", serviceYAML("web", 8080)+"---\n"+broken)
			},
			check: func(t *testing.T, src *DirSource, sink *recordingSink, logs *lockedBuffer, before int) {
				waitLog(t, logs, "web.yaml: document 2: Service.spec.ports.port")
				waitErrors(t, src, 1)
				if got := sink.callsSince(before); len(got) != 0 {
					t.Errorf("calls after broken edit = %q, want none", got)
				}
				if got := sink.servicePort("Service default/web"); got != 80 {
					t.Errorf("web port = %d, want the previous 80", got)
				}
				errs := src.Errors()
				var me *ManifestError
				if len(errs) != 1 || !errors.As(errs[0], &me) || me.Document != 2 || filepath.Base(me.File) != "web.yaml" {
					t.Errorf("Errors() = %v, want one error for web.yaml document 2", errs)
				}
				if src.ErrorsTotal() != 1 {
					t.Errorf("ErrorsTotal() = %d, want 1", src.ErrorsTotal())
				}
			},
		},
		{
			name: "fixing a broken file puts its new content in force",
			files: map[string]string{
				"web.yaml": serviceYAML("web", 80) + "---\nkind: Service\n",
			},
			change: func(t *testing.T, dir string) {
				writeFile(t, dir, "web.yaml", serviceYAML("web", 81))
			},
			until: wantPort("Service default/web", 81),
			check: func(t *testing.T, src *DirSource, _ *recordingSink, logs *lockedBuffer, _ int) {
				if !strings.Contains(logs.String(), "web.yaml: document 2: Service.apiVersion: required") {
					t.Errorf("logs lack the initial error:\n%s", logs)
				}
				if errs := src.Errors(); len(errs) != 0 {
					t.Errorf("Errors() = %v after the fix, want none", errs)
				}
			},
		},
		{
			name: "a broken file does not affect another file",
			files: map[string]string{
				"web.yaml": serviceYAML("web", 80),
				"db.yaml":  serviceYAML("db", 5432),
			},
			change: func(t *testing.T, dir string) {
				writeFile(t, dir, "web.yaml", serviceYAML("web", 80)+"  bogus: [\n")
				writeFile(t, dir, "db.yaml", serviceYAML("db", 5433))
			},
			until: wantPort("Service default/db", 5433),
			check: func(t *testing.T, _ *DirSource, sink *recordingSink, logs *lockedBuffer, _ int) {
				waitLog(t, logs, "web.yaml: document 1: invalid YAML")
				if got := sink.servicePort("Service default/web"); got != 80 {
					t.Errorf("web port = %d, want 80 still in force", got)
				}
			},
		},
		{
			name: "an object defined in a second file is rejected there",
			files: map[string]string{
				"a.yaml": serviceYAML("web", 80),
			},
			change: func(t *testing.T, dir string) {
				writeFile(t, dir, "b.yaml", serviceYAML("db", 5432)+"---\n"+serviceYAML("web", 9999))
			},
			check: func(t *testing.T, src *DirSource, sink *recordingSink, logs *lockedBuffer, _ int) {
				waitLog(t, logs, "b.yaml: document 2: Service default/web is already defined in")
				waitErrors(t, src, 1)
				if got := sink.keys(); !slices.Equal(got, []string{"Service default/web"}) {
					t.Errorf("objects = %q, want only a.yaml's", got)
				}
				if got := sink.servicePort("Service default/web"); got != 80 {
					t.Errorf("web port = %d, want a.yaml's 80", got)
				}
				if len(src.Errors()) != 1 {
					t.Errorf("Errors() = %v, want the duplicate", src.Errors())
				}
			},
		},
		{
			name:  "atomic save by rename over the file is picked up",
			files: map[string]string{"web.yaml": serviceYAML("web", 80)},
			change: func(t *testing.T, dir string) {
				writeFile(t, dir, ".web.yaml.tmp", serviceYAML("web", 8081))
				if err := os.Rename(filepath.Join(dir, ".web.yaml.tmp"), filepath.Join(dir, "web.yaml")); err != nil {
					t.Fatal(err)
				}
			},
			until: wantPort("Service default/web", 8081),
		},
		{
			name:  "vim-style save (move away, write anew) is picked up",
			files: map[string]string{"web.yaml": serviceYAML("web", 80)},
			change: func(t *testing.T, dir string) {
				path := filepath.Join(dir, "web.yaml")
				if err := os.Rename(path, path+"~"); err != nil {
					t.Fatal(err)
				}
				writeFile(t, dir, "web.yaml", serviceYAML("web", 8082))
				if err := os.Remove(path + "~"); err != nil {
					t.Fatal(err)
				}
			},
			until: wantPort("Service default/web", 8082),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				writeFile(t, dir, name, content)
			}
			src, sink, logs := startDirSource(t, dir)
			before := sink.callCount()
			tt.change(t, dir)
			if tt.until != nil {
				sink.waitFor(t, tt.name, func() bool { return tt.until(sink) })
			}
			if tt.check != nil {
				tt.check(t, src, sink, logs, before)
			}
		})
	}
}

// TestDirSourceConfigMapVolume replays how the kubelet updates a ConfigMap
// volume: files are symlinks through "..data", itself a symlink to a
// timestamped folder that is swapped by renaming a new symlink over it.
func TestDirSourceConfigMapVolume(t *testing.T) {
	dir := t.TempDir()
	publish := func(version, content string) {
		t.Helper()
		ts := "..2026_01_01_00_00_0" + version
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, ts), "web.yaml", content)
		if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish("1", serviceYAML("web", 80))
	if err := os.Symlink(filepath.Join("..data", "web.yaml"), filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	_, sink, _ := startDirSource(t, dir)
	if got := sink.servicePort("Service default/web"); got != 80 {
		t.Fatalf("web port = %d, want 80", got)
	}

	publish("2", serviceYAML("web", 8080))
	if err := os.RemoveAll(filepath.Join(dir, "..2026_01_01_00_00_01")); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, "the swapped content", func() bool { return sink.servicePort("Service default/web") == 8080 })
}

func TestDirSourceMissingFolder(t *testing.T) {
	src := NewDirSource(filepath.Join(t.TempDir(), "absent"), "node-a", slog.New(slog.DiscardHandler))
	err := src.Run(context.Background(), newRecordingSink())
	if err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("Run = %v, want an error naming the folder", err)
	}
}

func TestDirDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		content string
		want    []string // one per error, in order
	}{
		{
			name:    "YAML syntax error names the file's line",
			file:    "web.yaml",
			content: serviceYAML("a", 1) + "---\napiVersion: v1\nkind: Service\nspec: [\n",
			want:    []string{"web.yaml: document 2: invalid YAML: line 12:"},
		},
		{
			name:    "unknown field is reported with its path",
			file:    "web.yaml",
			content: strings.Replace(serviceYAML("a", 1), "  - port: 1\n", "  - port: 1\n    targetport: 80\n", 1),
			want:    []string{`web.yaml: document 1: Service.spec.ports[0].targetport: unknown field`},
		},
		{
			name:    "wrong type is reported with its path",
			file:    "web.yaml",
			content: strings.Replace(serviceYAML("a", 1), "port: 1", "port: one", 1),
			want:    []string{"web.yaml: document 1: Service.spec.ports.port: got string, want int32"},
		},
		{
			name:    "duplicate key",
			file:    "web.yaml",
			content: serviceYAML("a", 1) + "  type: ClusterIP\n  type: NodePort\n",
			want:    []string{`web.yaml: document 1: Service: invalid YAML: line 10: key "type" already set in map`},
		},
		{
			name:    "missing kind and apiVersion",
			file:    "web.yaml",
			content: "metadata:\n  name: a\n---\napiVersion: v1\nmetadata:\n  name: b\n",
			want:    []string{"web.yaml: document 1: apiVersion, kind: required", "web.yaml: document 2: kind: required"},
		},
		{
			name:    "unsupported apiVersion of a known kind",
			file:    "web.yaml",
			content: "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata:\n  name: a\n",
			want:    []string{`web.yaml: document 1: EndpointSlice.apiVersion: "discovery.k8s.io/v1beta1" is not supported, use "discovery.k8s.io/v1"`},
		},
		{
			name:    "missing name",
			file:    "web.yaml",
			content: "apiVersion: v1\nkind: Service\nspec: {}\n",
			want:    []string{"web.yaml: document 1: Service.metadata.name: required"},
		},
		{
			name:    "object defined twice in one file",
			file:    "web.yaml",
			content: serviceYAML("a", 1) + "---\n" + serviceYAML("a", 2),
			want:    []string{"web.yaml: document 2: Service default/a is defined twice in this file (first in document 1)"},
		},
		{
			name:    "List item error names the item",
			file:    "api.json",
			content: strings.Replace(serviceListJSON, `"port": 443`, `"port": "https"`, 1),
			want:    []string{"api.json: document 1: items[0]: Service.spec.ports.port: got string, want int32"},
		},
		{
			name:    "not an object",
			file:    "web.yaml",
			content: "- a\n- b\n",
			want:    []string{"web.yaml: document 1: not an object"},
		},
	}
	d := newManifestDecoder()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, _, errs := d.decodeFile(tt.file, []byte(tt.content))
			if len(errs) != len(tt.want) {
				t.Fatalf("errors = %v (objects %d), want %d errors", errs, len(objs), len(tt.want))
			}
			for i, err := range errs {
				if !strings.HasPrefix(err.Error(), tt.want[i]) {
					t.Errorf("error %d = %q, want prefix %q", i, err, tt.want[i])
				}
			}
		})
	}
}

// batchingSink records whether each Service and EndpointSlice came inside
// a Batch.
type batchingSink struct {
	*recordingSink
	mu      sync.Mutex
	in      bool
	batches int
	outside []string
}

func (b *batchingSink) Batch(fn func()) {
	b.mu.Lock()
	b.in, b.batches = true, b.batches+1
	b.mu.Unlock()
	fn()
	b.mu.Lock()
	b.in = false
	b.mu.Unlock()
}

func (b *batchingSink) note(what string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.in {
		b.outside = append(b.outside, what)
	}
}

func (b *batchingSink) OnService(ns, name string, svc *v1.Service) {
	b.note("Service " + name)
	b.recordingSink.OnService(ns, name, svc)
}

func (b *batchingSink) OnEndpointSlice(ns, name string, s *discovery.EndpointSlice) {
	b.note("EndpointSlice " + name)
	b.recordingSink.OnEndpointSlice(ns, name, s)
}

// A reload is one batch: a file's Service and EndpointSlice change
// together for a Batcher (the tracker), whatever the order they are sent in.
func TestDirSourceDeliversAReloadAsOneBatch(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "web.yaml", serviceYAML("web", 80)+"---\n"+sliceYAML("web-1", "web"))
	sink := &batchingSink{recordingSink: newRecordingSink()}
	src := NewDirSource(dir, "node-a", slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	t.Cleanup(func() { cancel(); <-done })
	sink.waitSynced(t)

	before := sink.callCount()
	writeFile(t, dir, "web.yaml", serviceYAML("web", 81)+"---\n"+strings.Replace(sliceYAML("web-1", "web"), "10.1.0.5", "10.1.0.6", 1))
	sink.waitFor(t, "the reload", func() bool { return sink.callCount() >= before+2 })
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.outside) > 0 || sink.batches < 2 {
		t.Errorf("%d batches; delivered outside one: %q", sink.batches, sink.outside)
	}
}
