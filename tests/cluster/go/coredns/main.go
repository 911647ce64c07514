// CoreDNS for the test cluster: the coredns command (coremain, as github.com/coredns/coredns's own
// main runs it) with only the plugins the cluster's Corefile uses, in CoreDNS's execution order
// (the order of its plugin.cfg). Choosing plugins at compile time is how CoreDNS documents
// building a smaller server (see core/dnsserver); it leaves out the cloud back ends (Route 53,
// Azure, Cloud DNS), tracing and the rest, which nothing on this offline machine could use:
// 800 packages to build instead of the full command's 1,409.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	if err := dnsserver.SetDirectives([]string{"ready", "health", "errors", "cache", "kubernetes", "file"}); err != nil {
		panic(err)
	}
	coremain.Run()
}
