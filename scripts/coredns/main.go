// CoreDNS with the plugins a cluster's DNS needs and no others: Service and Pod names from the API server
// (kubernetes), on the node's address (bind), with a cache, health and readiness endpoints, and logs of errors.
// CoreDNS's own main imports every plugin it has, cloud providers' SDKs included, which triples the build for
// nothing the local node uses.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
