package conformance

import (
	"fmt"
	"strings"
	"time"
)

// Markdown renders REPORT.md: the totals per column, what passes in the
// baseline and not in a kp column, every test in every column, the
// failures' messages, the skips with their reasons, and each run's
// versions and times.
func (r *Results) Markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Upstream's Services tests: kp against kube-proxy\n\n")
	p("Written by `make conformance` (test/conformance); do not edit. Each column is one run of upstream's own\n")
	p("e2e tests (`e2e.test` of Kubernetes, under ginkgo) on a fresh real-node cluster of test/cluster, with one\n")
	p("node proxy. The tests are those whose name matches\n\n    %s\n\nless the skips listed below. Upstream kube-proxy is the referee: every test that passes with it in a mode\n", r.Focus)
	p("must pass in kp's column of that mode (`%s` for a mode upstream has no column of). results.json holds the\nsame data. Every column ran at kp commit %s, built from a clean tree.\n\n", Baseline, r.Commit)

	p("## Totals\n\n")
	p("| column | proxy | passed | failed | skipped | tests took | setup took | run |\n|---|---|---:|---:|---:|---:|---:|---|\n")
	for _, run := range r.Runs {
		p("| %s | %s | %d | %d | %d | %s | %s | %s |\n", run.Mode, run.Proxy, run.Totals[Passed], run.Totals[Failed],
			run.Totals[Skipped], dur(run.Seconds), dur(run.SetupSeconds), run.Started.UTC().Format("2006-01-02 15:04 UTC"))
	}
	p("\n")

	p("## Passes with upstream, not with kp\n\n")
	reg := r.Regressions()
	for _, run := range r.Runs {
		baseline := r.baselineOf(run.Mode)
		if baseline == "" {
			continue
		}
		if len(reg[run.Mode]) == 0 {
			p("- %s (against %s): none.\n", run.Mode, baseline)
			continue
		}
		var open, known []string
		for _, name := range reg[run.Mode] {
			if why, ok := explained(run.Mode, name, r.reason(name, run.Mode)); ok {
				known = append(known, fmt.Sprintf("%s — *known limit:* %s", name, why))
			} else {
				open = append(open, name)
			}
		}
		p("- %s (against %s): %d, %d of them explained by the mode's known limits:\n", run.Mode, baseline, len(reg[run.Mode]), len(known))
		for _, name := range open {
			p("  - **%s** (not explained)\n", name)
		}
		for _, k := range known {
			p("  - %s\n", k)
		}
	}
	p("\n")

	// Skip reasons get short keys for the table's cells: S1… for the skip
	// rules, T1… for the tests that skipped themselves.
	keys := map[string]string{}
	for i, s := range r.Skips {
		keys[s.Reason] = fmt.Sprintf("S%d", i+1)
	}
	var own []string
	for _, t := range r.Tests {
		for _, run := range r.Runs {
			res, ok := t.Results[run.Mode]
			if ok && res.State == Skipped && keys[res.Reason] == "" {
				own = append(own, res.Reason)
				keys[res.Reason] = fmt.Sprintf("T%d", len(own))
			}
		}
	}

	p("## Every test\n\n| test |")
	for _, run := range r.Runs {
		p(" %s |", run.Mode)
	}
	p("\n|---|")
	for range r.Runs {
		p("---|")
	}
	p("\n")
	for _, t := range r.Tests {
		p("| %s |", cell(t.Name))
		for _, run := range r.Runs {
			res, ok := t.Results[run.Mode]
			switch {
			case !ok:
				p(" – |")
			case res.State == Passed:
				p(" passed (%s) |", dur(res.Seconds))
			case res.State == Failed:
				p(" **FAILED** (%s) |", dur(res.Seconds))
			default:
				p(" skipped (%s) |", keys[res.Reason])
			}
		}
		p("\n")
	}
	p("\n")

	p("## Failures\n\n")
	any := false
	for _, run := range r.Runs {
		for _, t := range r.Tests {
			res, ok := t.Results[run.Mode]
			if !ok || res.State != Failed {
				continue
			}
			any = true
			p("- %s, **%s** (%s):\n\n  ```\n", run.Mode, t.Name, res.Location)
			for _, l := range strings.Split(res.Reason, "\n") {
				p("  %s\n", l)
			}
			p("  ```\n\n")
		}
	}
	if !any {
		p("None.\n\n")
	}

	p("## Skips\n\nSkipped by pattern (ginkgo `--skip`): what cannot exist on this machine's clusters.\n\n")
	p("| | pattern | why |\n|---|---|---|\n")
	for i, s := range r.Skips {
		p("| S%d | `%s` | %s |\n", i+1, strings.ReplaceAll(s.Pattern, "|", `\|`), cell(s.Reason))
	}
	if len(own) > 0 {
		p("\nSkipped by the tests themselves (e2eskipper: a precondition the cluster does not meet):\n\n| | message |\n|---|---|\n")
		for i, m := range own {
			p("| T%d | %s |\n", i+1, cell(m))
		}
	}
	p("\n")

	p("## Runs\n\n")
	for _, run := range r.Runs {
		p("### %s\n\n", run.Mode)
		p("- proxy: %s\n- cluster: %s\n- tests: %s\n", run.Proxy, run.Cluster, run.Ginkgo)
		p("- started %s; cluster, proxy and DNS up in %s; tests took %s\n", run.Started.UTC().Format(time.RFC3339),
			dur(run.SetupSeconds), dur(run.Seconds))
		notRun := 0
		for _, t := range r.Tests {
			if res, ok := t.Results[run.Mode]; ok && res.Reason == NotRun {
				notRun++
			}
		}
		if notRun > 0 {
			p("- **interrupted**: %d tests did not run (counted as skipped)\n", notRun)
		}
		for _, note := range run.Reruns {
			p("- rerun: %s\n", note)
		}
		if run.SuiteFailure != "" {
			p("- the suite's own setup or teardown failed:\n\n  ```\n")
			for _, l := range strings.Split(strings.TrimSpace(run.SuiteFailure), "\n") {
				p("  %s\n", l)
			}
			p("  ```\n")
		}
		p("\n")
	}
	return b.String()
}

// cell makes s fit in one table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

// dur prints seconds for a person: 12s, 3m04s.
func dur(s float64) string {
	d := time.Duration(s * float64(time.Second)).Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%ds", int(d.Seconds()))
	}
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
