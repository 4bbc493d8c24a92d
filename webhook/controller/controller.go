// Package controller holds dislock's controllers, one subpackage each, all
// run by the elected leader only: outcome labels finished pods and their
// Jobs and puts an Event on the CronJob; secretcopy (copies of the
// administrator's database Secret) or tenants (a database role of each
// namespace's own) keeps the database Secret of every opted-in namespace.
// This package holds what the last two share: the label of the Secrets they
// own and the watches they run on.
package controller

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ManagedByLabel, valued ManagedByValue, marks the database Secrets the
// webhook owns: it only ever updates or deletes Secrets that carry it.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "dislock"
)

// ForNamespaces reconciles namespaces, and the namespaces the Secret events
// secrets maps to.
func ForNamespaces(mgr ctrl.Manager, name string, secrets handler.MapFunc, r reconcile.Reconciler) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		For(&corev1.Namespace{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(secrets)).
		Complete(r)
}

// ManagedSecretNamespace maps an event on a Secret called name that carries
// the managed-by label to its namespace.
func ManagedSecretNamespace(name string, o client.Object) []reconcile.Request {
	if o.GetName() == name && o.GetLabels()[ManagedByLabel] == ManagedByValue {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	}
	return nil
}
