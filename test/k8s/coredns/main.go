// Command coredns is a CoreDNS with only the plugins a cluster DNS needs, for
// the real-node tests' cluster DNS. CoreDNS's own main links every plugin,
// and with them the cloud SDKs of route53, azure and clouddns; importing
// coremain and a handful of plugins keeps the build to a minute or two.
package main

import (
	"fmt"
	"os"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// Each plugin registers itself with Caddy from its init.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives lists the linked plugins in execution order: a query passes
// through them in this order whatever order the Corefile names them in. It
// is the order of CoreDNS's plugin.cfg with the plugins not linked left out;
// a Corefile naming any other plugin fails to load.
var directives = []string{
	"reload",
	"ready",
	"health",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"loop",
	"forward",
}

func main() {
	if err := dnsserver.SetDirectives(directives); err != nil {
		fmt.Fprintln(os.Stderr, "coredns:", err)
		os.Exit(1)
	}
	coremain.Run()
}
