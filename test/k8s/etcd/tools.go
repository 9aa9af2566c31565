//go:build tools

// Package etcd pins the etcd server the tests run (see ../build.sh).
package etcd

import _ "go.etcd.io/etcd/server/v3"
