package tui

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"

	"github.com/kpproxy/kp/explain"
)

// Config configures kp top.
type Config struct {
	Source Source
	// Refresh is how often the status API and the conntrack table are
	// read; events stream in between.
	Refresh time.Duration
	// Color is false under NO_COLOR.
	Color bool
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Events is the conntrack event stream (see streamFlows); nil shows
	// only what each refresh reads.
	Events <-chan tea.Msg
	// RulePaths are kp explain's RulePathers by mode, for the explain
	// view's path through the mode's rules; nil leaves it out.
	RulePaths map[string]explain.RulePather
}

type inputMode int

const (
	inputNone inputMode = iota
	inputFilter
	inputCommand
)

// Model is kp top's root model: it owns the store and the pages, routes
// keys, and turns reads into redraws.
type Model struct {
	c   *Common
	s   *store
	cfg Config

	services *servicesPage
	flows    *flowsPage
	stack    []page // the page shown is the last
	help     bool

	mode   inputMode
	input  textinput.Model
	filter string
	notice string // the answer to a bad command or filter
}

// New returns kp top's model.
func New(cfg Config) *Model {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 2 * time.Second
	}
	c := &Common{Styles: NewStyles(cfg.Color), Keys: DefaultKeyMap(), Width: 80, Height: 24}
	s := newStore()
	m := &Model{c: c, s: s, cfg: cfg, input: textinput.New()}
	m.input.Prompt = ""
	m.services = newServicesPage(c, s)
	m.flows = newFlowsPage(c, s)
	m.stack = []page{m.services}
	m.layout()
	return m
}

func (m *Model) current() page { return m.stack[len(m.stack)-1] }

// Init reads for the first time and starts listening to the event stream.
func (m *Model) Init() tea.Cmd {
	return tea.Batch(m.fetch(), listen(m.cfg.Events))
}

func (m *Model) fetch() tea.Cmd {
	if m.cfg.Source == nil {
		return nil
	}
	// A read may take up to one refresh; a slower one is reported as a
	// failure and retried.
	return fetch(m.cfg.Source, max(m.cfg.Refresh, 2*time.Second), m.cfg.Now)
}

// Update handles one message. It reads nothing: every read happens in the
// commands it returns.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	var cmd tea.Cmd
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		if msg.Width <= 0 || msg.Height <= 0 {
			// A terminal of no size: kubectl exec -it's pseudo-terminal
			// until the container runtime applies the client's size, or
			// for good when that resize came too early. Draw at the last
			// size known (80×24 at first), the renderer included, which
			// otherwise draws nothing at 0×0.
			w, h := m.c.Width, m.c.Height
			return m, func() tea.Msg { return tea.WindowSizeMsg{Width: w, Height: h} }
		}
		m.c.Width, m.c.Height = msg.Width, msg.Height
	case snapshotMsg:
		m.s.applySnapshot(msg)
		m.current().refresh()
		cmd = tea.Tick(m.cfg.Refresh, func(t time.Time) tea.Msg { return tickMsg(t) })
	case tickMsg:
		cmd = m.fetch()
	case flowEventsMsg:
		m.s.applyEvents(msg)
		m.current().refresh()
		cmd = listen(m.cfg.Events)
	case watchErrMsg:
		m.s.watchErr = msg.Err
		cmd = listen(m.cfg.Events)
	case showDetailMsg:
		m.show(append(m.stack, newDetailPage(m.c, m.s, msg.sp)))
	case showExplainMsg:
		cmd = m.explain(msg.req)
	case explainedMsg:
		if p, ok := m.current().(*explainPage); ok && p.req.packet == msg.packet {
			p.answer(msg)
		}
	case tea.KeyPressMsg:
		cmd = m.key(msg)
	default:
		if m.mode != inputNone {
			m.input, cmd = m.input.Update(msg)
		}
	}
	m.layout()
	return m, cmd
}

// explain opens kp explain's answer for req (or reads it again, when
// it is open) and reads it.
func (m *Model) explain(req explainRequest) tea.Cmd {
	if req.err != nil {
		m.notice = fmt.Sprintf("cannot explain %s: %v", req.what, req.err)
		return nil
	}
	if p, ok := m.current().(*explainPage); !ok || p.req.packet != req.packet {
		m.show(append(m.stack, newExplainPage(m.c, req)))
	}
	return readExplanation(m.cfg.Source, req.packet, explain.Options{RulePaths: m.cfg.RulePaths}, max(m.cfg.Refresh, 5*time.Second), m.cfg.Now)
}

// show switches to a page stack; a filter belongs to the page it was typed
// on.
func (m *Model) show(stack []page) {
	m.stack = stack
	m.setFilter("")
	m.help = false
	m.layout()
	m.current().refresh()
}

func (m *Model) key(msg tea.KeyPressMsg) tea.Cmd {
	k := m.c.Keys
	if msg.String() == "ctrl+c" {
		return tea.Quit
	}
	if m.mode != inputNone {
		return m.inputKey(msg)
	}
	if m.help {
		switch {
		case key.Matches(msg, k.Back), key.Matches(msg, k.Help):
			m.help = false
		case key.Matches(msg, k.Quit):
			return tea.Quit
		}
		return nil
	}
	m.notice = ""
	switch {
	case key.Matches(msg, k.Quit):
		return tea.Quit
	case key.Matches(msg, k.Help):
		m.help = true
	case key.Matches(msg, k.Filter):
		m.mode = inputFilter
		m.input.SetValue(m.filter)
		m.input.CursorEnd()
		return m.input.Focus()
	case key.Matches(msg, k.Command):
		m.mode = inputCommand
		m.input.SetValue("")
		return m.input.Focus()
	case key.Matches(msg, k.Back):
		if m.filter != "" {
			m.setFilter("")
		} else if len(m.stack) > 1 {
			m.show(m.stack[:len(m.stack)-1])
		}
	default:
		return m.current().Update(msg)
	}
	return nil
}

func (m *Model) inputKey(msg tea.KeyPressMsg) tea.Cmd {
	k := m.c.Keys
	switch {
	case key.Matches(msg, k.Enter):
		mode := m.mode
		m.mode = inputNone
		m.input.Blur()
		if mode == inputCommand {
			return m.command(strings.TrimSpace(m.input.Value()))
		}
		return nil
	case key.Matches(msg, k.Back):
		if m.mode == inputFilter {
			m.setFilter("")
		}
		m.mode = inputNone
		m.input.Blur()
		return nil
	}
	var cmd tea.Cmd
	m.input, cmd = m.input.Update(msg)
	if m.mode == inputFilter {
		m.setFilter(m.input.Value())
	}
	return cmd
}

// setFilter filters the current page by a regular expression; one that
// does not compile leaves the list unfiltered and says why.
func (m *Model) setFilter(expr string) {
	m.filter = expr
	m.notice = ""
	var re *regexp.Regexp
	if expr != "" {
		var err error
		if re, err = regexp.Compile(expr); err != nil {
			m.notice = fmt.Sprintf("filter: %v", err)
			re = nil
		}
	}
	m.current().setFilter(re)
	m.current().refresh()
}

// command runs a : command.
func (m *Model) command(c string) tea.Cmd {
	switch c {
	case "svc", "svcs", "service", "services":
		m.show([]page{m.services})
	case "flows", "flow", "ct", "conntrack":
		m.show([]page{m.flows})
	case "q", "quit", "q!":
		return tea.Quit
	case "":
	default:
		m.notice = fmt.Sprintf("unknown command :%s (try :svc, :flows, :q)", c)
	}
	return nil
}

// layout gives the current page what the header and footer leave.
func (m *Model) layout() {
	m.current().SetSize(m.c.Width, m.c.Height-len(m.header())-1)
	m.input.SetWidth(max(m.c.Width-3, 1))
}
