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
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		log.Warn("cannot read RLIMIT_NOFILE", "err", err)
		return rlimitInfo{}
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err != nil {
			log.Warn("cannot raise RLIMIT_NOFILE to the hard limit", "soft", rl.Cur, "hard", rl.Max, "err", err)
			return rlimitInfo{cur: rl.Cur, max: rl.Max}
		}
		rl = want
	}
	log.Info("userspace proxy file descriptor limit", "RLIMIT_NOFILE", rl.Cur, "hardLimit", rl.Max)
	return rlimitInfo{cur: rl.Cur, max: rl.Max}
}
