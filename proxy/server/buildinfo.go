package server

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// runningBuild is b with the Go version and platform of this process where
// b leaves them empty.
func runningBuild(b statusapi.Build) statusapi.Build {
	if b.GoVersion == "" {
		b.GoVersion = runtime.Version()
	}
	if b.Platform == "" {
		b.Platform = runtime.GOOS + "/" + runtime.GOARCH
	}
	return b
}

// buildInfo is kp_build_info: a gauge of 1 whose labels say which kp runs,
// the shape of upstream's kubernetes_build_info (component-base's
// version metric), so a dashboard joins it on the instance to tell which
// nodes run which release.
func buildInfo(b statusapi.Build) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kp_build_info",
		Help: "A metric with a constant '1' value labeled by the version, commit, build date and Go version kp was built from",
	}, []string{"version", "commit", "build_date", "go_version"})
	g.WithLabelValues(b.Version, b.Commit, b.BuildDate, b.GoVersion).Set(1)
	return g
}
