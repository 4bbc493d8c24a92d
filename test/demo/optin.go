package main

// A team's way in, as docs/install.md tells it, run with each data centre's
// kubectl and printed as it runs: a namespace of the team's, labelled for
// injection, whose database role and Secret the webhook then provisions,
// and the CronJob applied from a manifest carrying dislock.io/mode.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/e2e"
)

// namespace is the team's: one the harness did not make, so that the demo
// opts it in the way a user does.
const namespace = "reports"

// provisionTimeout bounds the wait for the webhook to provision a newly
// labelled namespace's database role and Secret.
const provisionTimeout = time.Minute

// optIn labels the team's namespace in every data centre and waits for the
// webhook to provision it.
func optIn(ctx context.Context, env *e2e.Env, out *printer) error {
	label := contract.LabelInjection + "=" + contract.LabelInjectionEnabled
	for _, dc := range env.DCs {
		for _, args := range [][]string{{"create", "namespace", namespace}, {"label", "namespace", namespace, label}} {
			if err := kubectl(ctx, dc, out, args...); err != nil {
				return err
			}
		}
	}
	for _, dc := range env.DCs {
		took, err := awaitProvisioned(ctx, dc)
		if err != nil {
			return err
		}
		out.step("%s: the webhook created the namespace's own database role and Secret %s/%s in %v",
			dc.Name, namespace, e2e.DBSecretName, round(took))
	}
	return nil
}

// applyCronJob applies the CronJob to every data centre from a manifest
// written to dir.
func applyCronJob(ctx context.Context, env *e2e.Env, cfg config, dir string, out *printer) error {
	for _, dc := range env.DCs {
		cj := e2e.LedgerCronJob(dc.Name, cronJobName, "* * * * *", cfg.mode, e2e.Ledger{DSN: dc.BouncerDSN(), Work: work})
		cj.Namespace = namespace
		// As docs/install.md asks: one zone in every cluster, or the same
		// tick is a different window in each.
		cj.Spec.TimeZone = ptr.To("Etc/UTC")
		cj.TypeMeta = metav1.TypeMeta{APIVersion: batchv1.SchemeGroupVersion.String(), Kind: "CronJob"}
		manifest, err := yaml.Marshal(cj)
		if err != nil {
			return err
		}
		file := filepath.Join(dir, fmt.Sprintf("%s-%s.yaml", cronJobName, dc.Name))
		if err := os.WriteFile(file, manifest, 0o600); err != nil {
			return err
		}
		out.step("%s: %s holds CronJob %s/%s, schedule %q in %s, annotated %s: %s", dc.Name, filepath.Base(file),
			namespace, cronJobName, cj.Spec.Schedule, *cj.Spec.TimeZone, contract.AnnotationMode, cfg.mode)
		if err := kubectl(ctx, dc, out, "apply", "-f", file); err != nil {
			return err
		}
	}
	return nil
}

// kubectl runs and prints one kubectl command against dc, with its output.
func kubectl(ctx context.Context, dc *e2e.DC, out *printer, args ...string) error {
	shown := slices.Clone(args)
	if i := slices.Index(shown, "-f"); i >= 0 && i+1 < len(shown) {
		shown[i+1] = filepath.Base(shown[i+1]) // a manifest's path: its name says enough
	}
	o, err := dc.Kubectl(ctx, args...)
	out.step("%s: $ kubectl %s\n          %s", dc.Name, strings.Join(shown, " "), strings.TrimSpace(string(o)))
	return err
}

// awaitProvisioned waits until the webhook has provisioned namespace in dc:
// its database Secret exists, and so does the default ServiceAccount,
// without which the Jobs' pods are refused.
func awaitProvisioned(ctx context.Context, dc *e2e.DC) (time.Duration, error) {
	begun := time.Now()
	for {
		_, secretErr := dc.Client.CoreV1().Secrets(namespace).Get(ctx, e2e.DBSecretName, metav1.GetOptions{})
		_, saErr := dc.Client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if secretErr == nil && saErr == nil {
			return time.Since(begun), nil
		}
		if time.Since(begun) > provisionTimeout {
			return 0, fmt.Errorf("%s: namespace %s not provisioned within %v (database Secret: %v; default ServiceAccount: %v)",
				dc.Name, namespace, provisionTimeout, secretErr, saErr)
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}
