#!/bin/bash
# Shows that TestBenchGate can fail (issue 35): builds kp from the committed
# tree (git archive HEAD, in a temporary folder; nothing of this is in the
# product) with one deliberate regression, runs the gate against that
# binary through KP_TEST_BINDIR, and prints the gate's verdict. Needs root,
# like the gate. Results: test/bench/NOTES.md, "The regression gate".
#
#   bash test/bench/gate_demo.sh slow-render   # 0.5 ms more per Service port rendered: the cold start
#   bash test/bench/gate_demo.sh slow-render 100us   # the same, 0.1 ms (the budget's edge)
#   bash test/bench/gate_demo.sh slow-sync     # 3 ms more per sync: own sync per change
#   bash test/bench/gate_demo.sh fat           # 16 MiB more held from the start: peak RSS
set -euo pipefail
variant=${1:?usage: gate_demo.sh slow-render [DURATION]|slow-sync|fat}
spin=${2:-500us}
case $spin in *us) spin="${spin%us}*time.Microsecond" ;; *ms) spin="${spin%ms}*time.Millisecond" ;; *) echo "DURATION: NNus or NNms" >&2; exit 2 ;; esac
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d /tmp/kp-gate-demo-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git -C "$root" archive HEAD | tar -x -C "$tmp/" 
cd "$tmp"
case $variant in
slow-render) # every Service port rendered spins (0.5 ms unless given)
	perl -0pi -e 's/(func \(b \*Backend\) renderInto\([^\n]*\{\n)/$1\tfor t0 := time.Now(); time.Since(t0) < '"$spin"'; {\n\t}\n/' nft/service.go
	grep -q '"time"' nft/service.go || perl -0pi -e 's/import \(\n/import (\n\t"time"\n/' nft/service.go ;;
slow-sync) # every sync sleeps 3 ms
	perl -0pi -e 's/(func \(b \*Backend\) Sync\(ctx context.Context, s \*proxy.State\) error \{\n)/$1\ttime.Sleep(3 * time.Millisecond)\n/' nft/backend.go ;;
fat) # 16 MiB allocated, written and kept from the start
	perl -0pi -e 's/(func main\(\) \{\n)/$1\tballast = make([]byte, 16<<20)\n\tfor i := range ballast {\n\t\tballast[i] = 1\n\t}\n/; s/(\nfunc main\(\))/\nvar ballast []byte\n$1/' cmd/kp/main.go ;;
*) echo "unknown variant $variant" >&2; exit 2 ;;
esac
mkdir bin
go build -buildvcs=false -o bin/kp ./cmd/kp
echo "gate_demo: kp built with the $variant regression"; [ "$variant" != slow-render ] || grep -n "time.Since(t0)" nft/service.go
cd "$root/test/bench"
KP_TEST_BINDIR="$tmp/bin" go test -count=1 -v -run '^TestBenchGate$' . 2>&1 | grep -E 'gate_test.go|^(--- |ok|FAIL)' || true
