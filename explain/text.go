package explain

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Write prints e for a person: the verdict first, then the Service and
// address, the source, the policy and every endpoint, masquerade, affinity,
// the rule path and the flow's conntrack entries.
func Write(w io.Writer, e *Explanation) error {
	var b strings.Builder
	fmt.Fprintf(&b, "packet:     %s (%s mode)\n", e.Packet, modeName(e.Mode))
	fmt.Fprintf(&b, "verdict:    %s", strings.ToUpper(string(e.Verdict)))
	if e.Reject != "" {
		fmt.Fprintf(&b, " (%s)", e.Reject)
	}
	fmt.Fprintf(&b, "\n            %s\n", e.Why)
	if e.Service != nil {
		s := e.Service
		name := ""
		if s.PortName != "" {
			name = " (port " + s.PortName + ")"
		}
		fmt.Fprintf(&b, "service:    %s/%s %s/%d%s, type %s\n", s.Namespace, s.Name, s.Protocol, s.Port, name, s.Type)
	}
	fmt.Fprintf(&b, "address:    %s: %s\n", e.Address.Kind, e.Address.Detail)
	if e.Source.Why != "" {
		src := e.Source.Address
		if src == "" {
			src = "(not given)"
		}
		fmt.Fprintf(&b, "source:     %s: %s\n", src, e.Source.Why)
	}
	if f := e.Firewall; f != nil {
		fmt.Fprintf(&b, "source ranges: %s%s\n", strings.Join(f.Ranges, ", "), allowedText(f.Allowed))
	}
	if e.Policy != "" {
		fmt.Fprintf(&b, "policy:     %s (%s)\n", e.Policy, e.PolicyWhy)
	}
	if e.Topology != "" {
		fmt.Fprintf(&b, "topology:   %s\n", e.Topology)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if len(e.Endpoints) > 0 {
		if err := writeEndpoints(w, e.Endpoints); err != nil {
			return err
		}
	}
	return writeTail(w, e)
}

func writeEndpoints(w io.Writer, eps []Endpoint) error {
	fmt.Fprintln(w, "endpoints:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ENDPOINT\tNODE\tZONE\tCONDITION\tCHOSEN\tSHARE\tWHY")
	for _, x := range eps {
		chosen, share := "no", "-"
		if x.Eligible {
			chosen, share = "yes", fmt.Sprintf("%.0f%%", x.Probability*100)
		}
		why := x.Detail
		if x.Hairpin {
			why += "; hairpin: the client itself"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", x.Address, orDash(x.NodeName), orDash(x.Zone), condition(x), chosen, share, why)
	}
	return tw.Flush()
}

func writeTail(w io.Writer, e *Explanation) error {
	var b strings.Builder
	if m := e.Masquerade; m != nil {
		fmt.Fprintf(&b, "masquerade: %s (%s)\n", m.Decision, m.Why)
	}
	if a := e.Affinity; a != nil {
		fmt.Fprintf(&b, "affinity:   ClientIP, %ds", a.TimeoutSeconds)
		if a.PinnedTo != "" {
			fmt.Fprintf(&b, "; pinned to %s", a.PinnedTo)
		}
		if a.PinnedNote != "" {
			fmt.Fprintf(&b, "; %s", a.PinnedNote)
		}
		b.WriteString("\n")
	}
	writeRulePath(&b, &e.RulePath)
	switch {
	case len(e.Conntrack) > 0:
		b.WriteString("conntrack:\n")
		for _, c := range e.Conntrack {
			fmt.Fprintf(&b, "  %s %s -> %s, replies from %s to %s, %s, %ds left\n", c.Protocol, c.OrigSrc, c.OrigDst, c.ReplySrc, c.ReplyDst,
				c.State, c.TimeoutSeconds)
		}
	case e.ConntrackError != "":
		fmt.Fprintf(&b, "conntrack:  not read: %s\n", e.ConntrackError)
	default:
		b.WriteString("conntrack:  no entry for this flow\n")
	}
	for _, n := range e.Notes {
		fmt.Fprintf(&b, "note:       %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func condition(x Endpoint) string {
	switch {
	case x.Ready:
		return "ready"
	case x.Serving && x.Terminating:
		return "serving,terminating"
	case x.Terminating:
		return "terminating"
	}
	return "not-ready"
}

func allowedText(a *bool) string {
	switch {
	case a == nil:
		return ""
	case *a:
		return " (the client is inside: allowed)"
	}
	return " (the client is outside: refused)"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeRulePath prints the path as the kernel's trace words it: where,
// the rule (with its handle), the element it matched, the verdict.
func writeRulePath(b *strings.Builder, rp *RulePath) {
	if len(rp.Steps) == 0 {
		if rp.Absent != "" {
			fmt.Fprintf(b, "rules:      %s\n", rp.Absent)
		}
		return
	}
	fmt.Fprintf(b, "rules (%s), the first packet's path:\n", rp.Mode)
	for _, s := range rp.Steps {
		fmt.Fprintf(b, "  %s: %s", s.Where, s.Rule)
		if s.Handle != 0 {
			fmt.Fprintf(b, " # handle %d", s.Handle)
		}
		fmt.Fprintf(b, " (verdict %s)\n", s.Verdict)
		if s.Element != "" {
			fmt.Fprintf(b, "      element %s\n", s.Element)
		}
	}
	if rp.Note != "" {
		fmt.Fprintf(b, "  note: %s\n", rp.Note)
	}
}
