// Package kubeconfig finds the Kubernetes API server the way every dislock
// command that talks to it does: the --kubeconfig file when given, else
// in-cluster, else $KUBECONFIG or ~/.kube/config.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
)

// Load returns the REST configuration for path ("" to look for one).
func Load(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("no --kubeconfig and %w", err)
	}
	return cfg, nil
}
