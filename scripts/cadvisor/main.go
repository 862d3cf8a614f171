// Command cadvisor serves cAdvisor's container metrics of raw cgroups on /metrics, the series a node's kubelet
// serves on /metrics/cadvisor: the manager of cAdvisor's library module with its raw-cgroup factory alone (no
// Docker, containerd or CRI-O client), and its Prometheus collector with the default labels (id: the cgroup's
// path). The kubelet adds namespace, pod and container from its container runtime; where no kubelet runs, the
// scrape's relabelling adds them (inferop_devtools.cluster.addons.kubelet_labels).
//
// cAdvisor's own command (github.com/google/cadvisor/cmd) is a module the Go proxy does not serve, hence this
// main, built by scripts/kube-addons.sh.
package main

import (
	"flag"
	"net/http"
	"strings"
	"time"

	"github.com/google/cadvisor/lib/cache/memory"
	"github.com/google/cadvisor/lib/container"
	"github.com/google/cadvisor/lib/manager"
	"github.com/google/cadvisor/lib/metrics"
	info "github.com/google/cadvisor/lib/model"
	"github.com/google/cadvisor/lib/utils/sysfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address of the /metrics endpoint")
	prefixes := flag.String("raw-cgroup-prefixes", "/", "comma-separated cgroup paths whose subtrees are watched (/ for all)")
	interval := flag.Duration("housekeeping-interval", time.Second, "how often each container's stats are read")
	klog.InitFlags(nil)
	flag.Parse()

	included := container.MetricSet{
		container.CpuUsageMetrics:    struct{}{},
		container.MemoryUsageMetrics: struct{}{},
	}
	allowDynamic := false
	housekeeping := manager.HousekeepingConfig{Interval: interval, AllowDynamic: &allowDynamic}
	m, err := manager.New(memory.New(2*time.Minute, nil), sysfs.NewRealSysFs(), housekeeping, included,
		strings.Split(*prefixes, ","), nil, "", 0)
	if err != nil {
		klog.Fatalf("cannot create the manager: %v", err)
	}
	if err := m.Start(); err != nil {
		klog.Fatalf("cannot start the manager: %v", err)
	}
	http.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		registry := prometheus.NewRegistry()
		options := info.RequestOptions{IdType: info.TypeName, Count: 1, Recursive: true}
		registry.MustRegister(metrics.NewPrometheusCollector(m, nil, included, clock.RealClock{}, options))
		promhttp.HandlerFor(registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).ServeHTTP(w, r)
	})
	klog.Infof("serving cAdvisor metrics on http://%s/metrics", *listen)
	klog.Fatal(http.ListenAndServe(*listen, nil))
}
