package server

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"sort"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// Status records what the status API reports: the sync loop's outcomes and
// the last State synced into the kernel. Its methods are safe for
// concurrent use.
type Status struct {
	backend  proxy.Backend
	node     string
	clk      clock.PassiveClock
	start    time.Time
	health   *Health
	counters proxy.CounterReporter // nil when the backend does not count

	mu        sync.RWMutex
	state     *proxy.State
	lastSync  *statusapi.Sync
	lastError *statusapi.SyncError
	counts    statusapi.SyncCounts
	sysctls   []statusapi.Sysctl
	choice    *statusapi.ModeChoice
	build     *statusapi.Build
	cfg       proxy.Config
	facts     SnapshotFacts
}

// SetBuild records the kp binary that runs.
func (s *Status) SetBuild(b statusapi.Build) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.build = &b
}

// SetModeChoice records how the mode was chosen (nil: not said).
func (s *Status) SetModeChoice(c *statusapi.ModeChoice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.choice = c
}

// SetSysctls records the node settings made at start.
func (s *Status) SetSysctls(sysctls []statusapi.Sysctl) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sysctls = append([]statusapi.Sysctl(nil), sysctls...)
}

// NewStatus returns an empty Status for a proxy running backend on node.
// health (may be nil) supplies the healthy flag.
func NewStatus(backend proxy.Backend, node string, health *Health, clk clock.PassiveClock) *Status {
	s := &Status{backend: backend, node: node, clk: clk, start: clk.Now(), health: health}
	if cr, ok := backend.(proxy.CounterReporter); ok {
		s.counters = cr
	}
	return s
}

// Succeeded records a successful sync of st that ran from start to end.
func (s *Status) Succeeded(st *proxy.State, start, end time.Time, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = st
	s.lastSync = &statusapi.Sync{Time: end, DurationSeconds: end.Sub(start).Seconds(), Full: full, Generation: st.Generation}
	s.counts.Succeeded++
	if full {
		s.counts.Full++
	} else {
		s.counts.Partial++
	}
}

// Failed records a failed sync that ended at end.
func (s *Status) Failed(end time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Failed++
	s.lastError = &statusapi.SyncError{Time: end, Message: err.Error()}
}

// State returns the last State synced into the kernel (nil before the
// first successful sync).
func (s *Status) State() *proxy.State {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.state
}

// Report returns the body of /kp/v1/status.
func (s *Status) Report() *statusapi.Status {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := &statusapi.Status{
		APIVersion: "kp/" + statusapi.Version,
		Mode:       string(s.backend.Mode()),
		Node:       s.node,
		StartTime:  s.start,
		Now:        s.clk.Now(),
		Syncs:      s.counts,
		Sysctls:    append([]statusapi.Sysctl(nil), s.sysctls...),
	}
	if s.build != nil {
		b := *s.build
		r.Build = &b
	}
	if s.choice != nil {
		c := *s.choice
		c.Refused = append([]statusapi.RefusedMode(nil), c.Refused...)
		r.ModeChoice = &c
	}
	if s.health != nil {
		r.Healthy = s.health.Healthy()
	}
	if m, ok := s.backend.(Migrator); ok {
		r.Migration = m.Migration()
		if _, t := m.Current(); t.Mode == proxy.ModeIPTables {
			r.IPTablesBackend = t.IPTablesBackend
		}
	}
	if s.lastSync != nil {
		ls := *s.lastSync
		r.LastSync = &ls
	}
	if s.lastError != nil {
		le := *s.lastError
		r.LastError = &le
	}
	if s.state != nil {
		r.ServicePorts = len(s.state.Services)
		for _, eps := range s.state.Endpoints {
			r.Endpoints += len(eps)
		}
	}
	return r
}

// ServicesReport returns the body of /kp/v1/services, restricted to
// namespace and Service name when they are not empty.
func (s *Status) ServicesReport(namespace, name string) *statusapi.Services {
	s.mu.RLock()
	st, last := s.state, s.lastSync
	s.mu.RUnlock()
	r := &statusapi.Services{APIVersion: "kp/" + statusapi.Version, ServicePorts: []statusapi.ServicePort{},
		Node: statusapi.Node{Name: s.node}}
	if st == nil {
		return r
	}
	r.Generation = st.Generation
	if last != nil {
		r.SyncTime = last.Time
	}
	r.Node = statusapi.Node{Name: s.node, Zone: st.Node.Zone(), IPs: addrStrings(st.Node.IPs)}
	r.ServiceCIDRs = prefixStrings(st.ServiceCIDRs)
	var counters map[proxy.EndpointRef]proxy.EndpointCounter
	if s.counters != nil {
		var err error
		if counters, err = s.counters.EndpointCounters(st); err != nil {
			counters = nil
			r.CountersError = err.Error()
		}
	}
	r.ServicePorts = servicePortReports(st, counters, s.counters != nil, namespace, name)
	return r
}

// servicePortReports lists st's service ports, sorted by name, with their
// endpoints and counters.
func servicePortReports(st *proxy.State, counters map[proxy.EndpointRef]proxy.EndpointCounter, counted bool, namespace, name string) []statusapi.ServicePort {
	out := []statusapi.ServicePort{}
	for spn, sp := range st.Services {
		if (namespace != "" && spn.Namespace != namespace) || (name != "" && spn.Name != name) {
			continue
		}
		out = append(out, servicePortReport(sp, st.Endpoints[spn], st.Node, counters, counted))
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if a.PortName != b.PortName {
			return a.PortName < b.PortName
		}
		return a.Protocol < b.Protocol
	})
	return out
}

// Handler serves /kp/v1/status and /kp/v1/services as JSON, and takes
// mode switches (POST /kp/v1/migration) when the backend can switch; every
// write is JSON and bounded (jsonWrites).
func (s *Status) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+statusapi.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, s.Report())
	})
	mux.HandleFunc("GET "+statusapi.ServicesPath, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		writeJSON(w, s.ServicesReport(q.Get("namespace"), q.Get("service")))
	})
	mux.HandleFunc("GET "+statusapi.SnapshotPath, s.serveSnapshot)
	if m, ok := s.backend.(Migrator); ok {
		mux.HandleFunc("GET "+statusapi.MigrationPath, func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, m.Migration())
		})
		mux.HandleFunc("POST "+statusapi.MigrationPath, func(w http.ResponseWriter, r *http.Request) {
			serveMigrationRequest(w, r, m)
		})
	}
	return jsonWrites(mux)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// withProfiling adds Go's profiles at /debug/pprof/ when on.
func withProfiling(on bool, next http.Handler) http.Handler {
	if !on {
		return next
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/", next)
	return mux
}
