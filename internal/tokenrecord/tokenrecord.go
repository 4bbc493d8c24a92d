// Package tokenrecord keeps, outside the database, the highest fencing
// token a cluster has seen handed out: a ConfigMap in the webhook's
// namespace that only ever grows. A database restored from a backup is
// behind it; the webhook's elected replica then moves the token epoch past
// it before it confirms any new grant, and `dislock check --token-record`
// fails until it did. Each cluster keeps its own record; the epoch moves
// past the highest of those that are alive.
package tokenrecord

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Name is the record's ConfigMap in the webhook's namespace (the chart's
// Role grants exactly it).
const Name = "dislock-token-record"

// Record is what a cluster saw of the fencing tokens.
type Record struct {
	// HighWater is the highest token the database could have handed out
	// when it was recorded; Epoch its epoch.
	HighWater, Epoch int64
	// SystemID and Timeline name the PostgreSQL cluster and WAL timeline.
	SystemID, Timeline int64
	// Cluster is the --cluster-name of the webhook that wrote it.
	Cluster    string
	RecordedAt time.Time
}

// The ConfigMap's keys.
const (
	keyHighWater  = "highWater"
	keyEpoch      = "epoch"
	keySystemID   = "systemIdentifier"
	keyTimeline   = "timeline"
	keyCluster    = "cluster"
	keyRecordedAt = "recordedAt"
)

// ParseRef parses "<namespace>/<name>", as --token-record takes it.
func ParseRef(s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || validation.IsDNS1123Label(ns) != nil || validation.IsDNS1123Subdomain(name) != nil {
		return types.NamespacedName{}, fmt.Errorf("token record %q: want <namespace>/<name> of a ConfigMap, e.g. dislock-system/%s (the namespace dislock is installed in)", s, Name)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// Read reads the record; found is false when there is none yet.
func Read(ctx context.Context, r client.Reader, key types.NamespacedName) (rec Record, found bool, err error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, key, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return Record{}, false, nil
		}
		return Record{}, false, fmt.Errorf("reading the token record %s: %w", key, err)
	}
	rec, err = decode(cm.Data)
	if err != nil {
		return Record{}, true, fmt.Errorf("token record %s: %w (fix it or delete the ConfigMap only if the database was never restored since it was written)", key, err)
	}
	return rec, true, nil
}

func decode(data map[string]string) (Record, error) {
	var rec Record
	for _, f := range []struct {
		key string
		to  *int64
	}{{keyHighWater, &rec.HighWater}, {keyEpoch, &rec.Epoch}, {keySystemID, &rec.SystemID}, {keyTimeline, &rec.Timeline}} {
		v, err := strconv.ParseInt(data[f.key], 10, 64)
		if err != nil || v < 0 {
			return Record{}, fmt.Errorf("data.%s = %q: want a non-negative integer", f.key, data[f.key])
		}
		*f.to = v
	}
	rec.Cluster = data[keyCluster]
	if at := data[keyRecordedAt]; at != "" {
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			return Record{}, fmt.Errorf("data.%s = %q: want an RFC 3339 time", keyRecordedAt, at)
		}
		rec.RecordedAt = t
	}
	return rec, nil
}

func encode(rec Record) map[string]string {
	return map[string]string{
		keyHighWater:  strconv.FormatInt(rec.HighWater, 10),
		keyEpoch:      strconv.FormatInt(rec.Epoch, 10),
		keySystemID:   strconv.FormatInt(rec.SystemID, 10),
		keyTimeline:   strconv.FormatInt(rec.Timeline, 10),
		keyCluster:    rec.Cluster,
		keyRecordedAt: rec.RecordedAt.UTC().Format(time.RFC3339),
	}
}

// Raise records rec unless the record already holds a higher high water,
// creating the ConfigMap when there is none, and returns what the record
// holds after. Writers race on the resourceVersion: a lost race reads
// again, so the record never goes down.
func Raise(ctx context.Context, c client.Client, r client.Reader, key types.NamespacedName, rec Record) (Record, error) {
	for attempt := 0; ; attempt++ {
		var cm corev1.ConfigMap
		err := r.Get(ctx, key, &cm)
		switch {
		case apierrors.IsNotFound(err):
			cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
				Labels: map[string]string{"app.kubernetes.io/name": "dislock", "app.kubernetes.io/component": "token-record"}},
				Data: encode(rec)}
			err = c.Create(ctx, &cm)
		case err != nil:
			return Record{}, fmt.Errorf("reading the token record %s: %w", key, err)
		default:
			old, derr := decode(cm.Data)
			if derr != nil {
				return Record{}, fmt.Errorf("token record %s: %w: not overwritten", key, derr)
			}
			if old.HighWater >= rec.HighWater {
				return old, nil
			}
			cm.Data = encode(rec)
			err = c.Update(ctx, &cm)
		}
		if err == nil {
			return rec, nil
		}
		if (!apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err)) || attempt == 5 {
			return Record{}, fmt.Errorf("writing the token record %s: %w", key, err)
		}
		if ctx.Err() != nil {
			return Record{}, errors.Join(err, ctx.Err())
		}
	}
}
