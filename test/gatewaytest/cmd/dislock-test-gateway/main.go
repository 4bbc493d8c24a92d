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
	srv, err := gateway.Open(context.Background(), dsn, gateway.Config{Cluster: cluster,
		DecisionConns: decisionConns, RenewalConns: renewalConns, Credentials: gatewaytest.Credentials{}})
	if err != nil {
		return err
	}
	defer srv.Close()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	hs := gateway.NewHTTPServer(listen, srv, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	return hs.ListenAndServeTLS("", "")
}
