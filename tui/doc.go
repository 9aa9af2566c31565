// Package tui is kp top: a live terminal view of a node's Services, their
// endpoints' share of new connections and why each is or is not chosen (kp
// explain's reasons), and the conntrack flows attributed to them, with
// those pinned to gone endpoints or never answered highlighted. It reads kp proxy's status API and the kernel's conntrack table
// (through a Source) and never a backend's internals.
//
// The structure follows soft-serve's: one root tea.Model (Model) owns a
// shared Common (styles, keymap, size) and a store of what was read; pages
// (services, detail, flows, help) are components with Update, View and
// SetSize that render from the store and talk to the root with typed
// messages. Reading happens in commands; Update itself is pure, so tests
// drive it with messages and compare views against golden files.
package tui
