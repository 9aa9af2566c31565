package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// The status API (status, services, inventory, mode switches, profiles)
// is served on a Unix socket only root on the node can open, never on the
// network (issue 34): the status names every Service's endpoints and the
// node's settings, an inventory forks iptables-save, and a POST switches
// the node's mode. A hostNetwork pod, a browser on the node or a client
// off the node reaches nothing of it; kubectl exec into kp's pod does, so
// the operator's RBAC (pods/exec) is the gate for remote use.

// Permissions of the socket and its directory: root's, no one else's. The
// directory's mode is what refuses other users (connect(2) needs search
// permission on every directory of the path, and write permission on the
// socket), so a socket bound before its chmod is never open to them.
const (
	socketDirMode  os.FileMode = 0o700
	socketFileMode os.FileMode = 0o600
)

// listenSocket makes path's directory (0700, owned by kp's user), removes a
// socket left by a kp that is gone, and listens on path (0600). A
// directory owned by another user, or a live kp on path, is an error.
func listenSocket(path string) (net.Listener, error) {
	if path == "" {
		return nil, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, socketDirMode); err != nil {
		return nil, fmt.Errorf("status socket directory: %w", err)
	}
	if err := ownDir(dir); err != nil {
		return nil, err
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if err := os.Chmod(path, socketFileMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("status socket: %w", err)
	}
	return ln, nil
}

// ownDir makes dir 0700 when kp's user owns it (kubelet makes a hostPath
// DirectoryOrCreate 0755), and refuses one owned by another user: whoever
// owns it could replace the socket.
func ownDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("status socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok {
		return fmt.Errorf("status socket directory %s: not a directory", dir)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("status socket directory %s: owned by uid %d, not kp's (%d): choose another --status-socket", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm() != socketDirMode {
		if err := os.Chmod(dir, socketDirMode); err != nil {
			return fmt.Errorf("status socket directory: %w", err)
		}
	}
	return nil
}

// removeStaleSocket removes the socket at path when nothing answers on it
// (a kp that exited without removing it); a kp that answers keeps it.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("status socket: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("status socket %s: exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("status socket %s: another kp serves on it", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("status socket: remove stale %s: %w", path, err)
	}
	return nil
}

// socketHandler is what the socket serves: the status API (status,
// services, migration), the inventory, and Go's profiles (root on the
// node may read kp's memory anyway).
func socketHandler(status *Status, inventory InventoryFunc, node string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/kp/", status.Handler())
	inv := &inventoryCache{list: inventory, node: node}
	mux.Handle("GET "+statusapi.InventoryPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, inv.get(r.Context()))
	}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
