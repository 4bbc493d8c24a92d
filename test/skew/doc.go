// Package skew tests the version-skew contract of docs/install.md
// ("Upgrading"): the previous release's dislock-agent and dislock CLI, built
// from git, run next to the current ones against one database, through
// PgBouncer, while the clusters are upgraded one at a time and one is
// rolled back.
package skew
