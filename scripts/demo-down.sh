#!/usr/bin/env bash
# make demo-down: removes everything scripts/demo.sh made: the processes it
# started, its kpdemo-* network namespaces (with their veths, bridge and kp's
# nftables table) and /tmp/kpdemo. Safe to run when there is nothing to remove.
set -euo pipefail

STATE=/tmp/kpdemo
quiet=false
[[ ${1:-} == --quiet ]] && quiet=true
say() { $quiet || echo "$@"; }

[[ $EUID -eq 0 ]] || { echo "make demo-down: run as root (sudo make demo-down)" >&2; exit 1; }

namespaces=()
if command -v ip >/dev/null; then
	while read -r name _; do
		[[ $name == kpdemo-* ]] && namespaces+=("$name")
	done < <(ip netns list 2>/dev/null)
fi

# The processes demo.sh started: those in its pid files, and anything still
# running inside its namespaces (which only demo.sh put there).
pids=()
for f in "$STATE"/*.pid; do
	[[ -f $f ]] && pids+=("$(cat "$f")")
done
for ns in "${namespaces[@]}"; do
	pids+=($(ip netns pids "$ns" 2>/dev/null || true))
done
alive=()
declare -A seen=()
for pid in "${pids[@]}"; do
	[[ $pid =~ ^[0-9]+$ && -z ${seen[$pid]:-} ]] || continue
	seen[$pid]=1
	kill -0 "$pid" 2>/dev/null && alive+=("$pid")
done
if ((${#alive[@]})); then
	say "stopping ${#alive[@]} demo process(es): ${alive[*]}"
	kill -TERM "${alive[@]}" 2>/dev/null || true
	for _ in $(seq 50); do
		still=()
		for pid in "${alive[@]}"; do kill -0 "$pid" 2>/dev/null && still+=("$pid"); done
		((${#still[@]})) || break
		sleep 0.1
	done
	for pid in "${alive[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
fi

for ns in "${namespaces[@]}"; do
	say "deleting namespace $ns"
	ip netns del "$ns"
done
rm -rf "$STATE"
say "demo removed"
