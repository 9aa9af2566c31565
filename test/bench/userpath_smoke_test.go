package bench

import (
	"bytes"
	"testing"
)

// checkUserPathSmoke checks the smoke's paths a user hits at its largest
// N: for every proxy and the direct path, one window of each path per
// round with non-zero figures, every chosen Service answering in the
// window, and the paths' tables and target rows in the report.
func checkUserPathSmoke(t *testing.T, cfg config, res *Results) {
	t.Helper()
	n := cfg.Ns[len(cfg.Ns)-1]
	rounds := cfg.Rule.MinRounds
	for _, p := range append([]string{NoProxy}, cfg.Proxies...) {
		for _, path := range userPaths {
			var got []UserPath
			for _, u := range res.UserPaths {
				if u.Path == path && u.Proxy == p && u.N == n {
					got = append(got, u)
				}
			}
			if len(got) < rounds {
				t.Errorf("%s N=%d: %d windows of path %s, want %d at least", p, n, len(got), path, rounds)
				continue
			}
			for _, u := range got {
				if !(u.PerSec > 0 && u.Count > 0 && u.P50 > 0 && u.P50 <= u.P99) {
					t.Errorf("%s N=%d path %s: figures %+v: want a rate and 0 < p50 <= p99", p, n, path, u)
				}
				want := min(n, pathServiceCount)
				if path == pathServices && p != NoProxy && (u.Services != want || u.Reached != want || u.Seed == 0) {
					t.Errorf("%s N=%d: %d of %d Services answered in the window (want %d of %d, seed %d; %d attempts failed)",
						p, n, u.Reached, u.Services, want, want, u.Seed, u.Errors)
				}
			}
		}
	}
	var report bytes.Buffer
	if err := WriteReport(&report, res); err != nil {
		t.Fatal(err)
	}
	want := []string{"## Data path a user hits", "## Targets (issue 35: the data path a user hits)",
		"| kp: " + pathTitle(pathServices) + " ≥ 1.0× upstream-nft's |", "| kp: " + pathTitle(pathUDP),
		"| kp: " + pathTitle(pathNodePort), "| kp: connect latency p99 of new TCP connections over 100 Services ≤ 1.0× upstream-nft's |"}
	for _, w := range want {
		if !bytes.Contains(report.Bytes(), []byte(w)) {
			t.Errorf("report lacks %q", w)
		}
	}
}
