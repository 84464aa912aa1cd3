// Command kube-proxy is Kubernetes' kube-proxy at release v1.37.2 alone, built from that release's own module
// (k8s.io/kubernetes v1.37.2, its staging modules at v0.37.2) so the tests can run a kube-proxy older or newer
// than the one in tierlb-k8s. main is k8s.io/kubernetes/cmd/kube-proxy/proxy.go at that tag, unchanged; nothing
// here is part of the product tierlb ships.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // for client metric registration
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	command := app.NewProxyCommand()
	code := cli.Run(command)
	os.Exit(code)
}
