package proxy

import "context"

// ModeNone programs nothing. It is never chosen by auto nor accepted by
// --proxy-mode: only a switch asks for it (the Node annotation
// kpproxy.io/proxy-mode=none, obeyed only with --allow-mode-none:
// Config.AllowModeNone), when kp migrate cluster --rollback hands a node
// back to kube-proxy: kp removes its own rules while it keeps running, and
// leaves kube-proxy's alone (the take-over does not run in this mode), so
// the returning kube-proxy's rules serve alone.
const ModeNone Mode = "none"

// NoneBackend is ModeNone's backend: every call succeeds and changes
// nothing.
type NoneBackend struct{}

func (NoneBackend) Mode() Mode                         { return ModeNone }
func (NoneBackend) Probe(context.Context) error        { return nil }
func (NoneBackend) Sync(context.Context, *State) error { return nil }
func (NoneBackend) Cleanup(context.Context) error      { return nil }

var _ Backend = NoneBackend{}
