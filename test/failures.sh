#!/usr/bin/env bash
# failures.sh LOG: the failures of a `go test` run, as a short digest for the
# end of make test's output. A failing end-to-end test logs its processes'
# whole logs (etcd's, kp's) after its own messages, so a CI view of the
# output's tail shows those logs and loses the messages that say what
# failed; this prints the failed tests' names and the last test messages
# (file.go:line: ..., with their first continuation lines), at any depth of
# nesting (the VM
# tests relay the in-VM run's verbose output, where a failing test's
# messages come last before its --- FAIL), and nothing of the process logs.
set -euo pipefail

log=${1:?usage: failures.sh LOG}
max=${FAILURES_MAX:-40}

printf '\n===== failures (from %s; the whole output is there) =====\n' "$log"
awk -v max="$max" -v maxcont="${FAILURES_CONT:-6}" '
	# A test message: optional quoting and indentation, file.go:N: text.
	# A process log relayed by netns (its header starts with "--- ") and
	# log lines within it (klog, zap) do not match: they have no "file.go:N: "
	# at the start of the line.
	{ line = $0; sub(/^[> \t]+/, "", line); ind = length($0) - length(line) }
	# The continuation lines of a kept message (more indented than it): the
	# first few, as they often say what failed (when a failed attempt ran and
	# error); blank ones are skipped.
	cont && (line == "" || ind > msgind) {
		if (line != "" && ++cont <= maxcont + 1) kept[++n] = "    " trim(line)
		next
	}
	{ cont = 0 }
	line ~ /^--- FAIL: / || line ~ /^FAIL[ \t]/ || line ~ /^panic: / { keep(line); next }
	# The timeout of a test binary names the tests still running.
	line ~ /^running tests:/ { running = 1; keep(line); next }
	running && line ~ /^Test[^ ]* \(/ { keep(line); next }
	{ running = 0 }
	line ~ /^[A-Za-z0-9_.\/-]+\.go:[0-9]+: / && line !~ /^[^ ]+ --- / { if (keep(line)) { cont = 1; msgind = ind } }
	function keep(s) {
		if (s in seen) return 0
		seen[s] = 1
		kept[++n] = trim(s)
		return 1
	}
	function trim(s) { return length(s) > 200 ? substr(s, 1, 200) "…" : s }
	END {
		if (n == 0) { print "no test failure found in the log: see its end"; exit }
		from = n > max ? n - max + 1 : 1
		if (from > 1) printf "(%d earlier lines: see the log)\n", from - 1
		for (i = from; i <= n; i++) print kept[i]
	}
' "$log"
