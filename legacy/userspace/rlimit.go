package userspace

import (
	"log/slog"

	"golang.org/x/sys/unix"
)

// rlimitInfo is the process's RLIMIT_NOFILE after raiseNoFile.
type rlimitInfo struct{ cur, max uint64 }

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard limit: each
// listener holds one descriptor (two for UDP), each TCP connection two and
// each UDP session one, so the default soft limit (1024) ends the proxy
// at a few hundred Services. Go raises it at start too (since 1.19); this
// is explicit, logged and reported in errors.
func raiseNoFile(log *slog.Logger) rlimitInfo {
	rl, err := readNoFile()
	if err != nil {
		log.Warn("cannot read RLIMIT_NOFILE", "err", err)
		return rlimitInfo{}
	}
	if rl.cur < rl.max {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: rl.max, Max: rl.max}); err != nil {
			log.Warn("cannot raise RLIMIT_NOFILE to the hard limit", "soft", rl.cur, "hard", rl.max, "err", err)
			return rl
		}
		rl.cur = rl.max
	}
	log.Info("userspace proxy file descriptor limit", "RLIMIT_NOFILE", rl.cur, "hardLimit", rl.max)
	return rl
}

// readNoFile reads RLIMIT_NOFILE.
func readNoFile() (rlimitInfo, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return rlimitInfo{}, err
	}
	return rlimitInfo{cur: rl.Cur, max: rl.Max}, nil
}

// syncNoFile is the limit a sync budgets with (Backend.noFile): read
// again at every sync, because it can change while kp runs (prlimit
// --pid raises a running process's limits), and raised again when the
// hard limit was.
func (b *Backend) syncNoFile() rlimitInfo {
	rl, err := readNoFile()
	if err != nil {
		return b.limits() // as Probe left it
	}
	if rl != b.limits() {
		rl = raiseNoFile(b.log)
	}
	return rl
}

// limits is the RLIMIT_NOFILE the last Probe or Sync saw (zero before).
func (b *Backend) limits() rlimitInfo {
	if p := b.rlimit.Load(); p != nil {
		return *p
	}
	return rlimitInfo{}
}

func (b *Backend) setLimits(rl rlimitInfo) { b.rlimit.Store(&rl) }
