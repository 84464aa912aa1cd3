// Command tierlb-k8s is Kubernetes' own control plane, built from Kubernetes' code as one binary with
// subcommands (the way hyperkube and k3s do it), so the code the programs share compiles once:
//
//	tierlb-k8s kube-apiserver ...          k8s.io/kubernetes/cmd/kube-apiserver
//	tierlb-k8s kube-controller-manager ... k8s.io/kubernetes/cmd/kube-controller-manager
//	tierlb-k8s kube-proxy ...              k8s.io/kubernetes/cmd/kube-proxy
//	tierlb-k8s kubectl ...                 k8s.io/kubernetes/cmd/kubectl
//	tierlb-k8s etcd ...                    an embedded etcd 3.6 server (go.etcd.io/etcd/server/v3/embed)
//	tierlb-k8s etcd-compact ...            compacts an etcd's history to its current revision
//	tierlb-k8s pki ...                     a test cluster's certificates, keys and kubeconfigs
//
// Called through a link named after a subcommand (kubectl -> tierlb-k8s), it runs that subcommand. Each
// subcommand's main is Kubernetes' own, unchanged: this file only chooses which one runs. The tests and the
// demo start it; nothing here is part of the product tierlb ships.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// subcommands maps a name to its main; each returns the process's exit code.
var subcommands = map[string]func(args []string) int{
	"kube-apiserver":          apiserverMain,
	"kube-controller-manager": controllerManagerMain,
	"kube-proxy":              proxyMain,
	"kubectl":                 kubectlMain,
	"etcd":                    etcdMain,
	"etcd-compact":            etcdCompactMain,
	"pki":                     pkiMain,
}

func names() string {
	var all []string
	for name := range subcommands {
		all = append(all, name)
	}
	sort.Strings(all)
	return strings.Join(all, ", ")
}

func main() {
	// Called as a link named after a subcommand: that subcommand, with every argument.
	if run, ok := subcommands[filepath.Base(os.Args[0])]; ok {
		os.Exit(run(os.Args))
	}
	if len(os.Args) < 2 {
		fmt.Fprintf(os.Stderr, "usage: %s SUBCOMMAND [ARGS...]\nsubcommands: %s\n", os.Args[0], names())
		os.Exit(2)
	}
	run, ok := subcommands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown subcommand %q (one of: %s)\n", os.Args[0], os.Args[1], names())
		os.Exit(2)
	}
	// Each program's own main reads os.Args: give it the subcommand as its name.
	os.Args = os.Args[1:]
	os.Exit(run(os.Args))
}
