package tui

import (
	"fmt"
	"math"
	"strings"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// Columns of the Services view.
const (
	svcName = iota
	svcType
	svcAddresses
	svcPort
	svcEndpoints
	svcConnRate
	svcFlows
	svcTrouble
	svcByteRate
)

// servicesPage is the start screen: one row per Service port.
type servicesPage struct{ tablePage }

func newServicesPage(c *Common, s *store) *servicesPage {
	p := &servicesPage{tablePage{c: c, s: s, detailOf: func(r *row) spKey { return r.id.(spKey) }}}
	p.explainOf = func(r *row) explainRequest { return s.servicePacket(r.id.(spKey)) }
	p.t.cols = []column{
		svcName:      {title: "SERVICE", min: 14},
		svcType:      {title: "TYPE", width: 9, drop: 2},
		svcAddresses: {title: "ADDRESSES", min: 10},
		svcPort:      {title: "PORT(S)", min: 7},
		svcEndpoints: {title: "READY", width: 5, right: true},
		svcConnRate:  {title: "CONN/S", width: 6, right: true},
		svcFlows:     {title: "FLOWS", width: 5, right: true},
		// flows pinned to gone endpoints / UDP entries never answered
		svcTrouble:  {title: "GONE/UNR", width: 8, right: true},
		svcByteRate: {title: "BYTES/S", width: 7, right: true, drop: 1},
	}
	p.sorts = []sortKey{
		sortBinding("N", "name", svcName),
		sortBinding("T", "type", svcType),
		sortBinding("R", "endpoints ready", svcEndpoints),
		sortBinding("C", "new connections/s", svcConnRate),
		sortBinding("F", "active flows", svcFlows),
		sortBinding("G", "gone+unreplied flows", svcTrouble),
		sortBinding("B", "bytes/s", svcByteRate),
	}
	return p
}

func (p *servicesPage) name() string { return "services" }

func (p *servicesPage) refresh() {
	var rows []row
	if p.s.services != nil {
		flows, problems := p.s.activeFlows(), p.s.problems()
		for _, sp := range p.s.services.ServicePorts {
			r := p.row(sp, flows, problems[keyOf(sp)])
			if p.keep(r.cells) {
				rows = append(rows, r)
			}
		}
	}
	p.t.setRows(rows)
}

// row is a Service port's line; one with flows pinned to gone endpoints
// or UDP entries never answered is highlighted.
func (p *servicesPage) row(sp statusapi.ServicePort, flows map[spKey]int, trouble flowProblems) row {
	k := keyOf(sp)
	ready := 0
	for _, e := range sp.Endpoints {
		if e.Ready {
			ready++
		}
	}
	conn, okc := p.s.connRate[k]
	if !okc {
		conn = math.NaN()
	}
	bytes, okb := p.s.bytesRate[k]
	if !okb && !p.s.bytesKnown {
		bytes = math.NaN()
	}
	// As kubectl get services shows it: port[:nodePort]/protocol.
	port := fmt.Sprint(sp.Port)
	if sp.NodePort != 0 {
		port += fmt.Sprintf(":%d", sp.NodePort)
	}
	nflows, ntrouble := float64(flows[k]), float64(trouble.gone+trouble.unreplied)
	flowCell, troubleCell := fmt.Sprint(flows[k]), fmt.Sprintf("%d/%d", trouble.gone, trouble.unreplied)
	if p.s.flowsAt.IsZero() {
		flowCell, nflows, troubleCell, ntrouble = unknown, math.NaN(), unknown, math.NaN()
	}
	nan := math.NaN()
	return row{
		id:    k,
		alert: trouble.gone > 0 || trouble.unreplied > 0,
		cells: []string{
			svcName:      k.String(),
			svcType:      sp.Type,
			svcAddresses: strings.Join(addresses(sp), ","),
			svcPort:      port + "/" + sp.Protocol,
			svcEndpoints: fmt.Sprintf("%d/%d", ready, len(sp.Endpoints)),
			svcConnRate:  rate(conn),
			svcFlows:     flowCell,
			svcTrouble:   troubleCell,
			svcByteRate:  byteRate(bytes),
		},
		nums: []float64{nan, nan, nan, float64(sp.Port), float64(ready), orMinus(conn), orMinus(nflows),
			orMinus(ntrouble), orMinus(bytes)},
	}
}

// orMinus sorts an unknown number below zero.
func orMinus(v float64) float64 {
	if math.IsNaN(v) {
		return -1
	}
	return v
}

// addresses lists a Service port's virtual addresses: ClusterIPs, external
// IPs, LoadBalancer IPs.
func addresses(sp statusapi.ServicePort) []string {
	var a []string
	a = append(a, sp.ClusterIPs...)
	a = append(a, sp.ExternalIPs...)
	return append(a, sp.LoadBalancerIPs...)
}

func (p *servicesPage) View() string {
	waiting := ""
	if p.s.services == nil {
		waiting = "waiting for kp proxy's status API…"
	}
	return p.view(waiting, "(no Service port matches the filter)", "(kp proxy has no Service ports)")
}
