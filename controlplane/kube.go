package main

// The mains of Kubernetes' programs, as in k8s.io/kubernetes/cmd/<name>/<name>.go at v1.36.3.

import (
	"os"
	_ "time/tzdata" // for CronJob time zones, as kube-apiserver and kube-controller-manager import it

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
)

func apiserverMain([]string) int {
	return cli.Run(apiserver.NewAPIServerCommand())
}

func controllerManagerMain([]string) int {
	return cli.Run(controllermanager.NewControllerManagerCommand())
}

func proxyMain([]string) int {
	return cli.Run(proxy.NewProxyCommand())
}

func kubectlMain([]string) int {
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err) // prints the error and exits with kubectl's code
	}
	return 0
}
