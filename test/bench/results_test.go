package bench

import (
	"math"
	"testing"
)

func TestQuantileIsNearestRankAndMedianAveragesTheMiddlePair(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[99-i] = float64(i + 1) // unsorted on purpose
	}
	for _, c := range []struct {
		name string
		xs   []float64
		q    float64
		want float64
	}{
		{"median of odd count", []float64{3, 1, 2}, 0.5, 2},
		{"median of even count", []float64{4, 1, 3, 2}, 0.5, 2.5},
		{"p99 of 1…100", hundred, 0.99, 99},
		{"p99 of three", []float64{1, 2, 3}, 0.99, 3},
		{"max", []float64{5, 7}, 1, 7},
	} {
		if got := Quantile(c.xs, c.q); got != c.want {
			t.Errorf("%s: Quantile(%v) = %v, want %v", c.name, c.q, got, c.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("median of nothing is not NaN")
	}
}

func TestCountsPrintWithThousandsSeparators(t *testing.T) {
	for n, want := range map[int]string{1: "1", 100: "100", 1000: "1,000", 30000: "30,000", 1234567: "1,234,567"} {
		if got := fmtN(n); got != want {
			t.Errorf("fmtN(%d) = %q, want %q", n, got, want)
		}
	}
}
