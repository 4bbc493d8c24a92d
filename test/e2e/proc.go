package e2e

// watchdogScript runs beside the environment: when the test process dies
// without Close, it kills the processes whose pid files are in $1 and
// removes $1. The clusters, nodes and PostgreSQL have watchdogs of their own.
const watchdogScript = `
read -r _
for f in "$1"/*.pid; do
	[ -e "$f" ] || continue
	kill -KILL "$(cat "$f")" 2>/dev/null
done
sleep 1
rm -rf "$1"
`
