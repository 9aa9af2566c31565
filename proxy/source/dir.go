package source

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/kpproxy/kp/proxy"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
)

const (
	// dirDebounce is how long the folder must stay quiet before a reload:
	// editors and ConfigMap updates touch several files in a burst.
	dirDebounce = 100 * time.Millisecond
	// dirMaxDelay bounds the wait when the folder never goes quiet.
	dirMaxDelay = time.Second
)

// DirSource is the folder source (kp proxy --manifests DIR): Services,
// EndpointSlices, ServiceCIDRs and the proxy's own Node written as API
// manifests in the files of one folder, watched for changes.
//
// Each file stands on its own: a file that fails to decode (or defines an
// object another file already defines) is reported and its last good content
// stays in force, so one broken edit never takes down the Services of
// another file, nor those of the broken file.
type DirSource struct {
	dir      string
	nodeName string
	log      *slog.Logger
	decoder  *manifestDecoder
	debounce time.Duration
	maxDelay time.Duration

	mu          sync.Mutex
	errs        []error
	errorsTotal uint64

	// Owned by Run's goroutine.
	files     map[string]*manifestFile // by base name
	delivered map[objectKey]runtime.Object
}

// manifestFile is what the source knows of one file.
type manifestFile struct {
	path    string
	sum     [sha256.Size]byte
	decoded bool   // sum is the content objs and parseErrs were decoded from
	readErr string // the last read error, to log it once
	// objs is the decoded current content; it is only used when parseErrs
	// is empty.
	objs      []manifestObject
	parseErrs []error
	// conflicts are the current "defined in two files" errors; they depend
	// on other files, so they are recomputed on every reload.
	conflicts []error
	// inForce is what the file contributes now: its last content that
	// decoded and did not conflict (nothing if it never did).
	inForce map[objectKey]manifestObject
}

var _ proxy.Source = (*DirSource)(nil)

// NewDirSource returns a source reading the manifests in dir. Only the Node
// named nodeName is passed on; other Nodes are ignored.
func NewDirSource(dir string, nodeName string, log *slog.Logger) *DirSource {
	return &DirSource{
		dir:       dir,
		nodeName:  nodeName,
		log:       log.With("source", "manifests", "dir", dir),
		decoder:   newManifestDecoder(),
		debounce:  dirDebounce,
		maxDelay:  dirMaxDelay,
		files:     make(map[string]*manifestFile),
		delivered: make(map[objectKey]runtime.Object),
	}
}

// Errors returns the problems currently keeping manifests (or parts of them)
// out of force, one per rejected document, ordered by file. It is empty when
// every file is in force as written.
func (s *DirSource) Errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errs)
}

// ErrorsTotal counts every manifest error reported since the start (an
// error is reported once, when it appears), for a metrics counter.
func (s *DirSource) ErrorsTotal() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errorsTotal
}

// Run loads the folder, reports OnSynced, then reloads on every change until
// ctx is done. It fails only when the folder cannot be watched at all.
func (s *DirSource) Run(ctx context.Context, sink proxy.Sink) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch manifests folder %s: %w", s.dir, err)
	}
	defer w.Close()
	// Watch before the first read so no change falls in between. Watching
	// the folder, not the files, catches editors that save by renaming a
	// new file over the old one, and ConfigMap volumes, which swap the
	// "..data" symlink the files point through.
	if err := w.Add(s.dir); err != nil {
		return fmt.Errorf("watch manifests folder %s: %w", s.dir, err)
	}
	s.reload(sink)
	sink.OnSynced()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	pending, first := false, time.Time{}
	schedule := func() {
		now := time.Now()
		if !pending {
			pending, first = true, now
		}
		timer.Reset(max(0, min(s.debounce, s.maxDelay-now.Sub(first))))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("watch manifests folder %s: watcher closed", s.dir)
			}
			if ev.Op == fsnotify.Chmod {
				continue // content unchanged
			}
			if ev.Name == filepath.Clean(s.dir) && ev.Op.Has(fsnotify.Remove|fsnotify.Rename) {
				s.log.Error("manifests folder removed; its objects stay in force until kp restarts")
			}
			schedule()
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("watch manifests folder %s: watcher closed", s.dir)
			}
			// An overflow lost events: a reload reads everything anyway.
			s.log.Warn("watching manifests folder", "error", err.Error())
			schedule()
		case <-timer.C:
			pending = false
			s.reload(sink)
		}
	}
}

// reload reads the folder, decides what each file contributes and delivers
// what changed since the last delivery.
func (s *DirSource) reload(sink proxy.Sink) {
	names, err := s.list()
	if err != nil {
		s.log.Error("cannot list manifests folder; current objects stay in force", "error", err.Error())
		return
	}
	reported := 0
	present := make(map[string]bool, len(names))
	for _, name := range names {
		path := filepath.Join(s.dir, name)
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone since the listing; the next event reloads
		}
		present[name] = true
		f := s.files[name]
		if f == nil {
			f = &manifestFile{path: path}
			s.files[name] = f
		}
		if err != nil {
			if f.readErr != err.Error() {
				s.log.Error("cannot read manifest; its previous content stays in force", "file", path, "error", err.Error())
				reported++
			}
			f.readErr, f.decoded = err.Error(), false
			f.parseErrs = []error{&ManifestError{File: path, Err: err}}
			continue
		}
		f.readErr = ""
		sum := sha256.Sum256(data)
		if f.decoded && sum == f.sum {
			continue
		}
		f.sum, f.decoded = sum, true
		reported += s.decode(f, data)
	}
	for name, f := range s.files {
		if !present[name] {
			s.log.Info("manifest removed", "file", f.path, "objects", len(f.inForce))
			delete(s.files, name)
		}
	}
	reported += s.resolve()

	// Errors are published before delivery, so whoever sees the sink's
	// new state also sees the errors that go with it.
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(s.files)) {
		errs = append(errs, s.files[name].parseErrs...)
		errs = append(errs, s.files[name].conflicts...)
	}
	s.mu.Lock()
	s.errs = errs
	s.errorsTotal += uint64(reported)
	s.mu.Unlock()

	s.deliver(sink)
}

// decode decodes a file's new content and logs the outcome. It returns the
// number of errors reported.
func (s *DirSource) decode(f *manifestFile, data []byte) int {
	objs, warnings, errs := s.decoder.decodeFile(f.path, data)
	f.objs, f.parseErrs = nil, errs
	for _, o := range objs {
		if o.key.Kind == "Node" && o.key.Name != s.nodeName {
			s.log.Debug("ignoring another node's Node", "file", f.path, "document", o.document, "node", o.key.Name)
			continue
		}
		f.objs = append(f.objs, o)
	}
	for _, w := range warnings {
		s.log.Warn("manifest document skipped", "file", f.path, "error", w.Error())
	}
	if len(errs) == 0 {
		s.log.Info("manifest loaded", "file", f.path, "objects", len(f.objs))
		return 0
	}
	msg := "manifest rejected; the file contributes nothing until it is fixed"
	if f.inForce != nil {
		msg = "manifest rejected; its previous content stays in force"
	}
	for _, err := range errs {
		var me *ManifestError
		document := 0
		if errors.As(err, &me) {
			document = me.Document
		}
		s.log.Error(msg, "file", f.path, "document", document, "error", err.Error())
	}
	return len(errs)
}

// deliver passes the sink every object that differs from what it was last
// given, and a deletion for every object no file defines any more, as one
// batch (Batcher).
func (s *DirSource) deliver(sink proxy.Sink) {
	current := make(map[objectKey]runtime.Object)
	for _, f := range s.files {
		for key, o := range f.inForce {
			current[key] = o.obj
		}
	}
	proxy.Batch(sink, func() {
		for _, key := range slices.SortedFunc(maps.Keys(s.delivered), compareKeys) {
			if _, ok := current[key]; !ok {
				s.send(sink, key, nil)
				delete(s.delivered, key)
			}
		}
		for _, key := range slices.SortedFunc(maps.Keys(current), compareKeys) {
			obj := current[key]
			if prev, ok := s.delivered[key]; ok && equality.Semantic.DeepEqual(prev, obj) {
				continue
			}
			s.send(sink, key, obj)
			s.delivered[key] = obj
		}
	})
}

// send hands one object (nil: deleted) to the sink. The sink gets a copy so
// nothing it does can change what later reloads compare against.
func (s *DirSource) send(sink proxy.Sink, key objectKey, obj runtime.Object) {
	switch key.Kind {
	case "Service":
		var svc *v1.Service
		if obj != nil {
			svc = obj.(*v1.Service).DeepCopy()
		}
		sink.OnService(key.Namespace, key.Name, svc)
	case "EndpointSlice":
		var slice *discovery.EndpointSlice
		if obj != nil {
			slice = obj.(*discovery.EndpointSlice).DeepCopy()
		}
		sink.OnEndpointSlice(key.Namespace, key.Name, slice)
	case "Node":
		var node *v1.Node
		if obj != nil {
			node = obj.(*v1.Node).DeepCopy()
		}
		sink.OnNode(node)
	case "ServiceCIDR":
		var cidr *networkingv1.ServiceCIDR
		if obj != nil {
			cidr = obj.(*networkingv1.ServiceCIDR).DeepCopy()
		}
		sink.OnServiceCIDR(key.Name, cidr)
	}
}

// list returns the names of the manifest files in the folder, sorted.
func (s *DirSource) list() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if !isManifestName(e.Name()) {
			continue
		}
		// Stat follows symlinks: ConfigMap volumes hold symlinks to files.
		fi, err := os.Stat(filepath.Join(s.dir, e.Name()))
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		names = append(names, e.Name())
	}
	return names, nil
}

// isManifestName accepts *.yaml, *.yml and *.json, except dotfiles (editor
// swap and lock files, ConfigMap volume internals) and editor backups.
func isManifestName(name string) bool {
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "#") || strings.HasSuffix(name, "~") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

func compareKeys(a, b objectKey) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}
