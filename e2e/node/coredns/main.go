// CoreDNS with only the plugins of the Corefile kubeadm writes (errors, health, ready, kubernetes,
// prometheus, forward, cache, loop, reload, loadbalance) and log, for the offline kind node image
// (e2e/node/build.sh builds it at COREDNS_VERSION). CoreDNS's own main imports every plugin,
// whose cloud SDKs (route53, azure, clouddns), etcd client and tracers are most of its build; this is
// the custom main CoreDNS documents for a chosen plugin set.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The plugins' order of execution: plugin.cfg's, restricted to those imported above.
func init() {
	dnsserver.Directives = []string{
		"reload",
		"ready",
		"health",
		"prometheus",
		"errors",
		"log",
		"loadbalance",
		"cache",
		"kubernetes",
		"loop",
		"forward",
	}
}

func main() {
	coremain.Run()
}
