package benchscale

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// DecisionStatements are the calls a pod's decision sends: its claim and
// its ledger row. A benchmark may swap either for the call it compares
// them with.
type DecisionStatements struct {
	Claim, Record string
}

// AgentDecision is what this release's agent sends.
var AgentDecision = DecisionStatements{Claim: store.ClaimWindowSQL, Record: store.RecordDecisionSQL}

// DecisionScript is one pgbench transaction doing what the pods of one key
// do at the top of the hour, one pod per cluster of clusters: each claims a
// fresh window of one of 100 keys of namespace ns (with its cluster's view;
// the first wins, the others are refused) and adds its decision to the
// ledger, in the pipeline and with the bounds the agent sends it with. tag
// keeps this script's keys apart from other scripts' in the same
// namespace; ttl is the claims' liveness.
func DecisionScript(st DecisionStatements, ns, tag string, clusters int, ttl time.Duration) (string, error) {
	buckets := make([]string, len(store.DurationBuckets))
	for i, le := range store.DurationBuckets {
		buckets[i] = strconv.FormatFloat(le, 'f', -1, 64)
	}
	view, err := json.Marshal(store.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: ttl.String()})
	if err != nil {
		return "", err
	}
	// The view's bytes, without the colons pgbench would take for its
	// variables.
	viewSQL := "convert_from(decode('" + base64.StdEncoding.EncodeToString(view) + "', 'base64'), 'UTF8')"
	script := "\\set k random(1, 100)\n\\set w random(1, 1000000000)\n"
	key := fmt.Sprintf("'%s/%s-' || :k", ns, tag)
	// Fresh windows, as recent as a herd's: older than the agent's largest
	// lateness (store.MaxClaimAge) is stale, and claims nothing.
	window := "'" + time.Now().UTC().Truncate(time.Hour).Format(time.RFC3339) + "'::timestamptz - :w * interval '1 microsecond'"
	for c := range clusters {
		cluster := fmt.Sprintf("dc-%d", c)
		prefix := fmt.Sprintf("'%s/%s/%s/uid-%s/'", cluster, ns, tag, cluster)
		claim, err := PgbenchScript(st.Claim, "", []string{key, window, "-1", prefix + " || 'pod'",
			"'" + cluster + "'", "'pod'", strconv.FormatInt(ttl.Microseconds(), 10), prefix, "false", viewSQL,
			strconv.FormatInt(store.DefaultViewRecency.Microseconds(), 10), strconv.FormatInt(store.ViewRefresh.Microseconds(), 10),
			strconv.FormatInt(store.MaxClaimAge.Microseconds(), 10)})
		if err != nil {
			return "", err
		}
		bounds, err := PgbenchScript(store.LedgerBoundsSQL, "", []string{
			"'" + strconv.FormatInt(store.LedgerLockTimeout.Milliseconds(), 10) + "'",
			"'" + strconv.FormatInt(store.LedgerStatementTimeout.Milliseconds(), 10) + "'"})
		if err != nil {
			return "", err
		}
		action := "skip"
		if c == 0 {
			action = "run"
		}
		row, err := PgbenchScript(st.Record, "", []string{key, window, "-1", "'" + cluster + "'", "'" + tag + "'", "'pod'",
			"'" + action + "'", "'window claimed, or already claimed by cluster dc-0 (dc-0/" + ns + "/" + tag + "/uid/pod, state running)'", "0", "NULL",
			"'{" + strings.Join(buckets, ",") + "}'"})
		if err != nil {
			return "", err
		}
		script += claim + "\\startpipeline\n" + bounds + row + "\\endpipeline\n"
	}
	return script, nil
}
