package proxy

// UsableEndpoints returns the endpoints that may receive new connections,
// with upstream kube-proxy's rule: every ready endpoint; when none is ready,
// the endpoints that are serving and terminating (so a rolling update's last
// pods keep answering); never an endpoint that is not serving.
func UsableEndpoints(eps []Endpoint) []Endpoint {
	var ready, terminating []Endpoint
	for _, e := range eps {
		switch {
		case e.Ready:
			ready = append(ready, e)
		case e.Serving && e.Terminating:
			terminating = append(terminating, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}
