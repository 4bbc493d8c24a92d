// Command dislock-test-gateway runs a lock gateway (lockagent/gateway) as a
// process of its own, so that a test can kill it as a node kills a pod: its
// calls in flight end with it. It accepts gatewaytest.Secret(namespace) as
// every namespace's credential.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"

	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/gatewaytest"
)

func main() {
	dsn := flag.String("database-url", "", "the database the gateway's calls run on")
	cluster := flag.String("cluster", "", "the cluster it serves")
	listen := flag.String("listen", "", "host:port")
	cert := flag.String("cert", "", "serving certificate (PEM)")
	key := flag.String("key", "", "its key (PEM)")
	decisionConns := flag.Int("decision-conns", 4, "connections of the decisions lane")
	renewalConns := flag.Int("renewal-conns", 2, "connections of the renewals lane")
	flag.Parse()
	if err := run(*dsn, *cluster, *listen, *cert, *key, *decisionConns, *renewalConns); err != nil {
		fmt.Fprintln(os.Stderr, "dislock-test-gateway:", err)
		os.Exit(1)
	}
}

func run(dsn, cluster, listen, certFile, keyFile string, decisionConns, renewalConns int) error {
	ctx := context.Background()
	open := func(conns int) (*store.Store, error) {
		return store.Open(ctx, dsn, store.Options{MaxConns: int32(conns)})
	}
	decisions, err := open(decisionConns)
	if err != nil {
		return err
	}
	renewals, err := open(renewalConns)
	if err != nil {
		return err
	}
	srv, err := gateway.NewServer(gateway.Config{Cluster: cluster, Decisions: decisions, Renewals: renewals,
		DecisionConns: decisionConns, RenewalConns: renewalConns, Credentials: gatewaytest.Credentials{}})
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	hs := gateway.NewHTTPServer(listen, srv, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	return hs.ListenAndServeTLS("", "")
}
