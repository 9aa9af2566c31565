package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/source"
)

// What makes kp proxy exit so that its pod restarts with new settings, as
// upstream's kube-proxy does: its --config file changing, and, with
// detectLocalMode NodeCIDR, its Node's pod CIDRs changing.

// errRestart is the cause of a stop kp asks for itself: the proxy loop's
// error is then this cause, and kp exits 1 (the pod restarts).
type errRestart struct{ reason string }

func (e errRestart) Error() string { return e.reason }

// watchConfigFile stops the proxy (cancel, with an errRestart cause) when
// the --config file's content is no longer what kp read. It watches the
// file (through its symlinks: a write in place), as upstream does, and its
// folder too: a ConfigMap volume replaces the file by swapping a symlink
// beside it, and an editor by renaming a new file over it; neither writes
// to the inode kp read. Every event re-reads the file: only a different
// content (or none) stops kp.
func watchConfigFile(ctx context.Context, path string, read []byte, log *slog.Logger, cancel context.CancelCauseFunc) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch --config %s: %w", path, err)
	}
	for _, p := range []string{filepath.Dir(path), path} {
		if err := w.Add(p); err != nil {
			_ = w.Close()
			return fmt.Errorf("watch --config %s: %w", path, err)
		}
	}
	go func() {
		defer func() { _ = w.Close() }()
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-w.Errors:
				log.Warn("watching the config file failed; a change to it will not restart kp", "file", path, "err", err)
				return
			case <-w.Events:
				// A write comes as a truncation, then the data: read
				// once the events stop for a moment.
				settle(w.Events, configSettle)
				now, err := os.ReadFile(path)
				if err == nil && bytes.Equal(now, read) {
					_ = w.Add(path) // the file kp now reads, if it was replaced
					continue
				}
				reason := "content of the proxy server's configuration file was updated"
				if err != nil {
					reason = fmt.Sprintf("the proxy server's configuration file cannot be read (%v)", err)
				}
				log.Error("the config file changed; exiting so that kp restarts with it, as kube-proxy does",
					"file", path, "reason", reason)
				cancel(errRestart{reason: "--config " + path + ": " + reason})
				return
			}
		}
	}()
	return nil
}

// configSettle is how long the config file's events must pause before kp
// reads it again.
const configSettle = 200 * time.Millisecond

// settle drains events until none came for d.
func settle(events <-chan fsnotify.Event, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
			t.Reset(d)
		case <-t.C:
			return
		}
	}
}

// podCIDRWatch is the observer that stops the proxy when the Node's pod
// CIDRs differ from those kp started with (detectLocalMode NodeCIDR).
type podCIDRWatch struct {
	want   []netip.Prefix
	log    *slog.Logger
	cancel context.CancelCauseFunc
}

func (w *podCIDRWatch) Synced(_ context.Context, _, cur *proxy.State) {
	got := cur.Node.PodCIDRs
	if len(got) == 0 || slices.Equal(got, w.want) {
		return
	}
	w.log.Error("the node's pod CIDRs changed; exiting so that kp restarts with them, as kube-proxy does",
		"node", cur.Node.Name, "podCIDRs", prefixList(w.want), "now", prefixList(got))
	w.cancel(errRestart{reason: fmt.Sprintf("detectLocalMode NodeCIDR: node %s's pod CIDRs changed from %s to %s",
		cur.Node.Name, prefixList(w.want), prefixList(got))})
}

// Upstream's waits for the Node's pod CIDRs at start (NodeManager).
const (
	podCIDRPoll    = time.Second
	podCIDRTimeout = 5 * time.Minute
)

// nodePodCIDRs reads the pod CIDRs of this node's Node object, for
// detectLocalMode NodeCIDR: from the API (waiting for them, as upstream
// waits, up to podCIDRTimeout) or from the --manifests folder.
func (a *app) nodePodCIDRs(ctx context.Context, cfg proxy.Config, client kubeclient.Interface) ([]netip.Prefix, error) {
	name := cfg.HostnameOverride
	if client == nil {
		return manifestPodCIDRs(cfg.ManifestsDir, name)
	}
	ctx, cancel := context.WithTimeout(ctx, a.podCIDRTimeout)
	defer cancel()
	var last error
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			n, _ := proxy.NodeFrom(name, node)
			if len(n.PodCIDRs) > 0 {
				return n.PodCIDRs, nil
			}
			err = errors.New("the Node has no spec.podCIDRs yet")
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("timeout waiting for PodCIDR allocation on node %q (detectLocalMode NodeCIDR): %w", name, last)
		case <-time.After(podCIDRPoll):
		}
	}
}

// manifestPodCIDRs reads the pod CIDRs of Node name from the manifests in
// dir.
func manifestPodCIDRs(dir, name string) ([]netip.Prefix, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		objs, _ := source.DecodeManifest(data)
		for _, o := range objs {
			if n, ok := proxyNode(o, name); ok && len(n.PodCIDRs) > 0 {
				return n.PodCIDRs, nil
			}
		}
	}
	return nil, fmt.Errorf("detectLocalMode NodeCIDR: no Node %q with spec.podCIDRs in --manifests %s", name, dir)
}

func prefixList(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, ",")
}

func proxyNode(o runtime.Object, name string) (proxy.Node, bool) {
	node, ok := o.(*v1.Node)
	if !ok || node.Name != name {
		return proxy.Node{}, false
	}
	n, _ := proxy.NodeFrom(name, node)
	return n, true
}
