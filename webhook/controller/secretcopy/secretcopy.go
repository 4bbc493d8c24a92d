// Package secretcopy keeps a copy of the administrator's database Secret in
// every opted-in namespace (--copy-db-secret, without tenant roles): one
// credential, shared by every namespace. It runs on the elected leader only.
package secretcopy

import (
	"context"
	"maps"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/webhook/controller"
	"github.com/dislock/dislock/webhook/inject"
)

var secretCopiesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "dislock_secret_copies_total",
	Help: "Database secret copies written or deleted in opted-in namespaces, by action.",
}, []string{"action"})

func init() { metrics.Registry.MustRegister(secretCopiesTotal) }

// Options configure the copies (set from the webhook's flags).
type Options struct {
	// Namespace is the webhook's, where the source Secret is (and where
	// no copy is made).
	Namespace string
	// SecretName is the database Secret's name, of the source and of every
	// copy (--db-secret-name).
	SecretName string
	// CA is --database-ca-file's content: a copy carries it as ca.crt when
	// the source has none, because the injected sidecar mounts that key
	// (inject.Options.DatabaseCA).
	CA []byte
}

// SetupWithManager adds the controller that keeps the copies.
func SetupWithManager(mgr ctrl.Manager, o Options) error {
	r := &secretCopier{Client: mgr.GetClient(), api: mgr.GetAPIReader(), source: types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName},
		ca: o.CA}
	return controller.ForNamespaces(mgr, "dbsecret-copier", r.namespacesFor, r)
}

// secretCopier keeps a copy of the database secret in every namespace
// labelled dislock.io/injection=enabled, because the sidecar's secretKeyRef
// can only name a Secret of the pod's own namespace. It only ever updates or
// deletes Secrets carrying its managed-by label: a Secret of the same name
// that a user created is left alone.
type secretCopier struct {
	client.Client
	// api reads the copy uncached: the cache only holds Secrets carrying the
	// managed-by label, so a user's own Secret of that name is not in it.
	api    client.Reader
	source types.NamespacedName
	ca     []byte // Options.CA
}

// namespacesFor maps a Secret event to the namespaces to reconcile: every
// namespace when the source changed, the copy's namespace when a copy did.
func (r *secretCopier) namespacesFor(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetNamespace() == r.source.Namespace && o.GetName() == r.source.Name {
		var nss corev1.NamespaceList
		if err := r.List(ctx, &nss, client.MatchingLabels{contract.LabelInjection: contract.LabelInjectionEnabled}); err != nil {
			log.FromContext(ctx).Error(err, "listing opted-in namespaces")
			return nil
		}
		out := make([]reconcile.Request, 0, len(nss.Items))
		for _, ns := range nss.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: ns.Name}})
		}
		return out
	}
	return controller.ManagedSecretNamespace(r.source.Name, o)
}

func (r *secretCopier) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("namespace", req.Name)
	if req.Name == r.source.Namespace {
		return reconcile.Result{}, nil
	}
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, req.NamespacedName, ns); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	want := ns.DeletionTimestamp == nil && ns.Labels[contract.LabelInjection] == contract.LabelInjectionEnabled
	src := &corev1.Secret{}
	if err := r.Get(ctx, r.source, src); apierrors.IsNotFound(err) {
		want = false
	} else if err != nil {
		return reconcile.Result{}, err
	}
	cur := &corev1.Secret{}
	err := r.api.Get(ctx, types.NamespacedName{Namespace: req.Name, Name: r.source.Name}, cur)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if exists && cur.Labels[controller.ManagedByLabel] != controller.ManagedByValue {
		if want {
			logger.Info("leaving a Secret dislock did not create alone", "secret", r.source.Name)
		}
		return reconcile.Result{}, nil
	}
	data := copiedData(src.Data, r.ca)
	switch {
	case want && !exists:
		cp := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: req.Name, Name: r.source.Name,
			Labels:      map[string]string{controller.ManagedByLabel: controller.ManagedByValue},
			Annotations: map[string]string{contract.AnnotationCopiedFrom: r.source.String()}},
			Type: src.Type, Data: data}
		if err := r.Create(ctx, cp); err != nil {
			return reconcile.Result{}, err
		}
		secretCopiesTotal.WithLabelValues("create").Inc()
		logger.Info("copied the database secret", "secret", r.source.Name)
	case want && exists && !maps.EqualFunc(cur.Data, data, func(a, b []byte) bool { return string(a) == string(b) }):
		cur.Data = data
		if err := r.Update(ctx, cur); err != nil {
			return reconcile.Result{}, err
		}
		secretCopiesTotal.WithLabelValues("update").Inc()
		logger.Info("updated the database secret copy", "secret", r.source.Name)
	case !want && exists:
		if err := r.Delete(ctx, cur); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, err
		}
		secretCopiesTotal.WithLabelValues("delete").Inc()
		logger.Info("deleted the database secret copy: the namespace is no longer opted in", "secret", r.source.Name)
	}
	return reconcile.Result{}, nil
}

// copiedData is what a copy of the source Secret holds: all of the source's
// keys (its own ca.crt among them), and the webhook's database CA as ca.crt
// when the source has none.
func copiedData(src map[string][]byte, ca []byte) map[string][]byte {
	if len(ca) == 0 || src[inject.DatabaseCAKey] != nil {
		return src
	}
	out := maps.Clone(src)
	if out == nil {
		out = map[string][]byte{}
	}
	out[inject.DatabaseCAKey] = ca
	return out
}
