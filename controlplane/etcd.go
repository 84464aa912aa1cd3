package main

// etcd for the tests' clusters: the etcd server's own code (go.etcd.io/etcd/server/v3/embed, the release line
// Kubernetes 1.36 is tested with), one member, on the URLs it is given.

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

func parseURLs(flagName, list string) ([]url.URL, error) {
	var urls []url.URL
	for _, s := range strings.Split(list, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--%s: %q is not a URL: %v", flagName, s, err)
		}
		urls = append(urls, *u)
	}
	return urls, nil
}

func etcdMain(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "directory for the member's data (required)")
	clientURLs := fs.String("listen-client-urls", "http://127.0.0.1:2379", "URLs to serve clients on")
	peerURLs := fs.String("listen-peer-urls", "http://127.0.0.1:2380", "URLs to serve the (single) peer on")
	noFsync := fs.Bool("unsafe-no-fsync", false, "skip fsync (tests: data on a temporary directory)")
	quotaBytes := fs.Int64("quota-backend-bytes", 0, "backend size quota; 0 is etcd's default")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = "tierlb-test"
	cfg.Dir = *dataDir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = *noFsync
	if *quotaBytes > 0 {
		cfg.QuotaBackendBytes = *quotaBytes
	}
	var err error
	if cfg.ListenClientUrls, err = parseURLs("listen-client-urls", *clientURLs); err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 2
	}
	cfg.AdvertiseClientUrls = cfg.ListenClientUrls
	if cfg.ListenPeerUrls, err = parseURLs("listen-peer-urls", *peerURLs); err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 2
	}
	cfg.AdvertisePeerUrls = cfg.ListenPeerUrls
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd: cannot start:", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60 s")
		return 1
	}
	fmt.Fprintf(os.Stderr, "etcd: ready on %s\n", *clientURLs)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	select {
	case sig := <-signals:
		fmt.Fprintf(os.Stderr, "etcd: %v, stopping\n", sig)
		return 0
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
}

// etcdCompactMain compacts the history up to the current revision, so every older resourceVersion a watcher
// holds is gone (the API server answers it 410 Gone): what a long-lived cluster's periodic compaction does.
func etcdCompactMain(args []string) int {
	fs := flag.NewFlagSet("etcd-compact", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "http://127.0.0.1:2379", "etcd client URLs, comma-separated")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd-compact:", err)
		return 1
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The revision of the store now: a read of any key carries it in its header.
	resp, err := client.Get(ctx, "compact-revision-probe")
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd-compact: cannot read the revision:", err)
		return 1
	}
	rev := resp.Header.Revision
	if _, err := client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-compact:", err)
		return 1
	}
	fmt.Println(rev)
	return 0
}
