// Package goinstall tests that kp installs as a Go user installs a command:
// `go install github.com/kpproxy/kp/cmd/kp@<version>`, which builds the
// module as its go.mod and go.sum say, without the replace directives a
// main module may have (the go command refuses a module that has any).
//
// The test serves this checkout through a module proxy of files (the layout
// `go mod download` reads: list, .info, .mod, .zip), the dependencies
// through the local module cache's own copy of that layout, so nothing is
// fetched from the network; the install writes into a GOPATH and module
// cache of its own.
package goinstall
