// Command enforcer is the node tier's NetworkPolicy enforcer: kube-router's network
// policy controller (pkg/controllers/netpol: iptables + ipset) and nothing else of
// kube-router — no BGP routing, no IPVS service proxy, no health or metrics server.
// Built by scripts/build-enforcer.sh; linking only this package keeps the build to a few
// CPU-seconds on top of the control plane's Go build cache (same k8s.io module versions,
// go.mod here), where kube-router's own command (gobgp, IPVS, docker, AWS SDK, client-go
// 0.29) took ~8 CPU-minutes cold.
//
// It takes kube-router's own flags (only the firewall's matter: --kubeconfig,
// --hostname-override, --service-cluster-ip-range, --iptables-sync-period, -v) and
// --cleanup-config, which removes the chains and sets the controller made, then exits.
// It runs until SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cloudnativelabs/kube-router/v2/pkg/controllers/netpol"
	"github.com/cloudnativelabs/kube-router/v2/pkg/healthcheck"
	"github.com/cloudnativelabs/kube-router/v2/pkg/options"
	"github.com/spf13/pflag"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "enforcer: %s\n", err)
		os.Exit(1)
	}
}

func run() error {
	klog.InitFlags(nil)
	config := options.NewKubeRouterConfig()
	config.AddFlags(pflag.CommandLine)
	pflag.Parse()
	if err := flag.Set("logtostderr", "true"); err != nil {
		return err
	}
	if err := flag.Set("v", config.VLevel); err != nil {
		return err
	}
	if config.CleanupConfig {
		(&netpol.NetworkPolicyController{}).Cleanup()
		return nil
	}
	if config.Kubeconfig == "" {
		return fmt.Errorf("--kubeconfig is required")
	}
	restConfig, err := clientcmd.BuildConfigFromFlags(config.Master, config.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}

	stopCh := make(chan struct{})
	factory := informers.NewSharedInformerFactory(client, 0)
	pods := factory.Core().V1().Pods().Informer()
	namespaces := factory.Core().V1().Namespaces().Informer()
	policies := factory.Networking().V1().NetworkPolicies().Informer()
	factory.Start(stopCh)
	synced := make(chan struct{})
	go func() { factory.WaitForCacheSync(stopCh); close(synced) }()
	select {
	case <-synced:
	case <-time.After(config.CacheSyncTimeout):
		return fmt.Errorf("informers not synced after %s", config.CacheSyncTimeout)
	}

	iptablesHandlers, ipsetHandlers, err := netpol.NewIPTablesHandlers(config)
	if err != nil {
		return err
	}
	var ipsetMutex sync.Mutex
	npc, err := netpol.NewNetworkPolicyController(client, config, pods, policies, namespaces,
		&ipsetMutex, iptablesHandlers, ipsetHandlers)
	if err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(npc.PodEventHandler); err != nil {
		return err
	}
	if _, err := namespaces.AddEventHandler(npc.NamespaceEventHandler); err != nil {
		return err
	}
	if _, err := policies.AddEventHandler(npc.NetworkPolicyEventHandler); err != nil {
		return err
	}

	// The controller reports a heartbeat each sync; nothing here checks them, but the
	// channel must be drained or its sync loop blocks.
	healthChan := make(chan *healthcheck.ControllerHeartbeat, 10)
	go func() {
		for range healthChan {
		}
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go npc.Run(healthChan, stopCh, &wg)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
	klog.Info("stopping the network policy controller")
	close(stopCh)
	wg.Wait()
	return nil
}
