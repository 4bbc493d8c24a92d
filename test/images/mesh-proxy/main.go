// Command mesh-proxy stands in for a classic (non-native) service-mesh
// sidecar such as istio-proxy in the end-to-end tests: a regular container
// that never exits by itself. It serves MESH_PROXY_ADDR (default
// 127.0.0.1:15020) and exits 0 when asked to with POST /quitquitquit, as
// Istio's pilot-agent does. Until then the pod cannot end.
package main

import (
	"log"
	"net/http"
	"os"
)

func main() {
	addr := os.Getenv("MESH_PROXY_ADDR")
	if addr == "" {
		addr = "127.0.0.1:15020"
	}
	quit := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /quitquitquit", func(w http.ResponseWriter, r *http.Request) {
		log.Printf("asked to quit by %s", r.RemoteAddr)
		w.WriteHeader(http.StatusOK)
		close(quit)
	})
	mux.HandleFunc("GET /healthz/ready", func(w http.ResponseWriter, r *http.Request) {})
	srv := &http.Server{Addr: addr, Handler: mux}
	go func() {
		<-quit
		srv.Close()
	}()
	log.Printf("serving %s; exits on POST /quitquitquit", addr)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
	log.Print("quit")
}
