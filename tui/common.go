package tui

import (
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
)

// Common is what every component shares: styles, the keymap and the
// terminal's size (each page's own height comes with SetSize).
type Common struct {
	Styles *Styles
	Keys   *KeyMap
	Width  int
	Height int
}

// component is a page of kp top. Pages keep pointers to Common and the
// store, so Update changes them in place and returns only a command.
type component interface {
	Update(msg tea.Msg) tea.Cmd
	View() string
	SetSize(width, height int)
}

// Styles are kp top's looks. Without colour (NO_COLOR) they use only
// attributes a plain terminal has: bold, reverse, faint.
type Styles struct {
	Header      lipgloss.Style
	Error       lipgloss.Style
	TableHeader lipgloss.Style
	Selected    lipgloss.Style
	Faint       lipgloss.Style
	Bar         lipgloss.Style
	Key         lipgloss.Style
	Title       lipgloss.Style
	// Alert highlights what shows trouble: flows pinned to gone
	// endpoints, UDP entries never answered, shares beyond chance.
	Alert lipgloss.Style
}

// NewStyles returns the styles, coloured unless color is false.
func NewStyles(color bool) *Styles {
	s := &Styles{
		Header:      lipgloss.NewStyle().Bold(true),
		Error:       lipgloss.NewStyle().Bold(true),
		TableHeader: lipgloss.NewStyle().Bold(true),
		Selected:    lipgloss.NewStyle().Reverse(true),
		Faint:       lipgloss.NewStyle().Faint(true),
		Bar:         lipgloss.NewStyle(),
		Key:         lipgloss.NewStyle().Bold(true),
		Title:       lipgloss.NewStyle().Bold(true),
		Alert:       lipgloss.NewStyle().Bold(true),
	}
	if color {
		s.Header = s.Header.Foreground(lipgloss.Color("12"))
		s.Error = s.Error.Foreground(lipgloss.Color("9"))
		s.TableHeader = s.TableHeader.Foreground(lipgloss.Color("14"))
		s.Bar = s.Bar.Foreground(lipgloss.Color("10"))
		s.Key = s.Key.Foreground(lipgloss.Color("11"))
		s.Title = s.Title.Foreground(lipgloss.Color("13"))
		s.Alert = s.Alert.Foreground(lipgloss.Color("9"))
	}
	return s
}

// KeyMap holds every key kp top answers to; components match keys only
// through it. The bindings follow k9s.
type KeyMap struct {
	Up, Down, PageUp, PageDown, Top, Bottom  key.Binding
	Enter, Back, Filter, Command, Help, Quit key.Binding
	// Explain opens kp explain's answer for the Service port or flow
	// under the cursor.
	Explain key.Binding
}

// DefaultKeyMap is kp top's keymap.
func DefaultKeyMap() *KeyMap {
	return &KeyMap{
		Up:       key.NewBinding(key.WithKeys("up", "k"), key.WithHelp("↑/k", "up")),
		Down:     key.NewBinding(key.WithKeys("down", "j"), key.WithHelp("↓/j", "down")),
		PageUp:   key.NewBinding(key.WithKeys("pgup", "ctrl+b"), key.WithHelp("pgup", "page up")),
		PageDown: key.NewBinding(key.WithKeys("pgdown", "ctrl+f", "space"), key.WithHelp("pgdn", "page down")),
		Top:      key.NewBinding(key.WithKeys("home", "g"), key.WithHelp("g", "top")),
		Bottom:   key.NewBinding(key.WithKeys("end", "G"), key.WithHelp("G", "bottom")),
		Enter:    key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "detail")),
		Back:     key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "back / clear filter")),
		Filter:   key.NewBinding(key.WithKeys("/"), key.WithHelp("/", "filter (regex)")),
		Command:  key.NewBinding(key.WithKeys(":"), key.WithHelp(":", "command (:svc, :flows, :q)")),
		Help:     key.NewBinding(key.WithKeys("?"), key.WithHelp("?", "help")),
		Quit:     key.NewBinding(key.WithKeys("q", "ctrl+c"), key.WithHelp("q", "quit")),
		Explain:  key.NewBinding(key.WithKeys("x"), key.WithHelp("x", "explain (why it goes there)")),
	}
}

// sortKey is a sort binding of one table column.
type sortKey struct {
	key.Binding
	col int
}

func sortBinding(k, desc string, col int) sortKey {
	return sortKey{key.NewBinding(key.WithKeys(k), key.WithHelp(k, "sort by "+desc)), col}
}
