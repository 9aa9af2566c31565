//go:build tools

// Package deps pins the product's direct dependencies while the packages
// that use them are being written; `go mod tidy` keeps what is listed here.
package deps

import (
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/google/nftables"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "github.com/vishvananda/netlink"
	_ "github.com/vishvananda/netns"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "k8s.io/klog/v2"
	_ "k8s.io/utils/clock/testing"
	_ "sigs.k8s.io/yaml"
)
