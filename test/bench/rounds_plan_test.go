package bench

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Round r's order is the first's rotated by r-1: every participant comes
// at every position once in len rounds, and the first round keeps the
// given order (a proxy before the floors that load its ruleset).
func TestRoundsRotateTheOrderOfTheirParticipants(t *testing.T) {
	who := []string{KP, UpstreamNFT, KPIPTables, floorNFT}
	firsts := map[string]int{}
	for r := 1; r <= 8; r++ {
		order := rotate(who, r-1)
		if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, slices.Sorted(slices.Values(who))) {
			t.Fatalf("round %d measures %v, not each of %v once", r, order, who)
		}
		if r == 1 && !slices.Equal(order, who) {
			t.Errorf("round 1 = %v, want the given order %v", order, who)
		}
		firsts[order[0]]++
	}
	for _, w := range who {
		if firsts[w] != 2 {
			t.Errorf("%s came first in %d of 8 rounds, want 2", w, firsts[w])
		}
	}
	if rotate([]string(nil), 3) != nil {
		t.Error("rotating nothing gave something")
	}
}

// The figures of one round pair: a proxy that dropped out of a round (or
// a reference whose load failed) leaves the other rounds paired.
func TestARatioPairsTheFiguresOfTheSameRound(t *testing.T) {
	r := &Results{Run: Run{ID: "run", Commit: "c"}}
	// kp 1 s in every round; upstream 10 s in rounds 1, 2 and 4, and 40 s
	// in round 3; the floor has no round 2 (a failed load).
	coldStarts(r, KP, 1000, []float64{1, 1, 1, 1}, 40<<20, 0)
	coldStarts(r, UpstreamNFT, 1000, []float64{10, 10, 40, 10}, 80<<20, 0)
	r.Floors = append(r.Floors, stamp("run", 1, Floor{N: 1000, Seconds: 0.5})...)
	r.Floors = append(r.Floors, stamp("run", 3, Floor{N: 1000, Seconds: 0.5})...)
	r.Floors = append(r.Floors, stamp("run", 4, Floor{N: 1000, Seconds: 0.5})...)
	if iv := ratio(r.coldStarts(UpstreamNFT, 1000, seconds), r.coldStarts(KP, 1000, seconds)); iv.Rounds != 4 || !(iv.Lo < 10 && iv.Hi > 20) {
		t.Errorf("upstream / kp = %+v: want 4 rounds, the interval spread by round 3's 40", iv)
	}
	if iv := ratio(r.coldStarts(KP, 1000, seconds), r.floors(floorNFT, 1000)); iv.Rounds != 3 || !near(iv.Mid, 2) || !near(iv.Hi, 2) {
		t.Errorf("kp / floor = %+v: want rounds 1, 3 and 4 only, each 2", iv)
	}
	xs, ys := paired(byRound{1: 1, 2: 2, 5: 5}, byRound{5: 50, 1: 10, 3: 30})
	if !slices.Equal(xs, []float64{1, 5}) || !slices.Equal(ys, []float64{10, 50}) {
		t.Errorf("paired = %v, %v; want rounds 1 and 5 in order: [1 5] [10 50]", xs, ys)
	}
	// A record measured outside the rounds pairs with nothing.
	r.Floors = stamp("run", 0, Floor{N: 1000, Seconds: 0.5})
	if len(r.floors(floorNFT, 1000)) != 0 {
		t.Error("a floor of no round was paired")
	}
}

// The default run's budget is computed before it from the rule: the cap of
// rounds at the expected cold starts; a proxy expected to run into its
// limit once.
func TestThePlanOfTheDefaultRunStatesItsBudget(t *testing.T) {
	cfg := config{Ns: []int{1, 10000}, Proxies: []string{KP, UpstreamIPTables}, Changes: 100, Window: 3 * time.Second,
		Idle: 5 * time.Second, SyncTimeout: 15 * time.Minute, Big: 10000, BigChanges: 20, BigTimeout: 6 * time.Minute,
		Rule: defaultRule}
	total, lines := cfg.plan()
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "N = 10,000: a round of cold starts") {
		t.Fatalf("plan = %q", lines)
	}
	// At 10,000: kp (1.41 s) and its floor (1.88 s) a round, 12 rounds;
	// upstream-iptables once, into its 6-minute limit; 2 × 12 rounds of
	// 2 windows of 4 s (none, kp); kp once more with its 100 changes. At
	// 1, 3 windows a round, and no changes.
	per := 10 * time.Second
	round := time.Duration((1.41+1.88)*float64(time.Second)) + per
	at10k := 12*round + 6*time.Minute + per + 2*12*2*4*time.Second +
		time.Duration(1.41*float64(time.Second)) + per + 100*300*time.Millisecond
	at1 := 12*(time.Duration((0.16+0.01+0.60)*float64(time.Second))+2*per) + 2*12*3*4*time.Second +
		time.Duration((0.16+0.60)*float64(time.Second)) + 2*per
	if d := total - at1 - at10k; d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("budget %v, want %v at 1 and %v at 10,000", total, at1, at10k)
	}
	// Churn phases at 10,000 for kp and upstream-iptables: kp's two
	// (5 minutes and 10 s each) and its restart with --min-sync-period 0
	// (1.41 s); upstream-iptables's none, as it is expected to run into
	// its limit before.
	cfg.Churn = churnConfig{Ns: []int{10000}, Rates: []float64{50, 200}, Proxies: []string{KP, UpstreamIPTables},
		Duration: 5 * time.Minute, Timeout: time.Minute}
	withChurn, _ := cfg.plan()
	if d := withChurn - total - 2*(5*time.Minute+10*time.Second) - 1410*time.Millisecond; d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("churn phases add %v to the budget, want 2 × 5 min 10 s and 1.41 s", withChurn-total)
	}
}

// The cold-start rounds: every participant once a round in a rotated
// order, a reference only after its proxy's first finished cold start, a
// proxy that ran into its limit and a reference whose load failed out of
// the rounds after.
func TestColdStartRoundsRotateAndDropWhatTimedOut(t *testing.T) {
	for _, c := range []struct {
		name       string
		timesOut   map[string]int // proxy -> the round its cold start runs into its limit
		loadFails  int            // the round the floor's load fails (0: never)
		rounds     int
		wantRounds [][]string
	}{
		{
			name:   "all finish: the order rotates",
			rounds: 4,
			wantRounds: [][]string{
				{KP, UpstreamNFT, floorNFT}, {UpstreamNFT, floorNFT, KP}, {floorNFT, KP, UpstreamNFT}, {KP, UpstreamNFT, floorNFT},
			},
		},
		{
			name:     "upstream runs into its limit in round 2: gone from round 3",
			timesOut: map[string]int{UpstreamNFT: 2},
			rounds:   4,
			wantRounds: [][]string{
				{KP, UpstreamNFT, floorNFT}, {UpstreamNFT, floorNFT, KP}, {floorNFT, KP}, {KP, floorNFT},
			},
		},
		{
			name:       "kp runs into its limit in round 1: its floor has no ruleset to load",
			timesOut:   map[string]int{KP: 1},
			rounds:     3,
			wantRounds: [][]string{{KP, UpstreamNFT}, {UpstreamNFT}, {UpstreamNFT}},
		},
		{
			name:       "the floor's load fails in round 2: gone from round 3",
			loadFails:  2,
			rounds:     3,
			wantRounds: [][]string{{KP, UpstreamNFT, floorNFT}, {UpstreamNFT, floorNFT, KP}, {KP, UpstreamNFT}},
		},
	} {
		kp := &participant{name: KP}
		parts := []*participant{kp, {name: UpstreamNFT}, {name: floorNFT, owner: kp}}
		var got [][]string
		measured := func(x *participant, round int) {
			for len(got) < round {
				got = append(got, nil)
			}
			got[round-1] = append(got[round-1], x.name)
		}
		rule := StopRule{MinRounds: c.rounds, MaxRounds: c.rounds, HalfWidth: 0.1}
		clock := &fakeClock{at: time.Unix(0, 0)}
		stop := coldStartRounds(rule, 1000, time.Hour, clock.now, parts,
			func(x *participant, round int) bool {
				measured(x, round)
				return c.timesOut[x.name] != round
			},
			func(x *participant, round int) error {
				if x.owner == nil || !x.owner.ready {
					t.Errorf("%s: %s loaded in round %d before its proxy's ruleset was there", c.name, x.name, round)
				}
				measured(x, round)
				if round == c.loadFails {
					return fmt.Errorf("segmentation fault")
				}
				return nil
			},
			func() float64 { return 0.5 })
		if stop.Rounds != c.rounds || !slices.EqualFunc(got, c.wantRounds, slices.Equal) {
			t.Errorf("%s: %d rounds measured %v; want %d: %v", c.name, stop.Rounds, got, c.rounds, c.wantRounds)
		}
	}
}
