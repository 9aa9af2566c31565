// Package archtest holds no code: its tests check the repository's shape,
// as docs/layout.md describes it — which package may import
// which, that the core (proxy) reaches no I/O library, and the size bounds
// of product files and functions.
package archtest
