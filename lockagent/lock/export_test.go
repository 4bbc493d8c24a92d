package lock

// ClaimWindowSQL and AcquireLeaseSQL let the benchmark hand pgbench the very
// statements the Store runs.
const (
	ClaimWindowSQL  = qClaimWindow
	AcquireLeaseSQL = qAcquireLease
)
