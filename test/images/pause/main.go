// Command pause is the test nodes' pod sandbox image: it holds a pod's
// namespaces and does nothing until the runtime stops it. As PID 1 it would
// ignore SIGTERM without a handler, so it exits on it explicitly.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
