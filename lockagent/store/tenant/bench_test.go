package tenant_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// BenchmarkTenantLogin measures what a pod's login costs its own CPU
// through PgBouncer (auth_query, SCRAM-SHA-256): the client derives its key
// with as many PBKDF2 iterations as the role's verifier names. The role
// Provision makes, against the same role with PostgreSQL's default count,
// 4 096, in the same run.
func BenchmarkTenantLogin(b *testing.B) {
	srv := pgtest.Need(b)
	owner := storetest.Open(b, srv.DirectDSN(), 1)
	ns := storetest.Namespace(b, "login")
	cred := storetest.Provision(b, owner, ns)
	super := storetest.RawConn(b, srv.SuperuserDSN())
	ctx := context.Background()
	for _, iterations := range []int{4096, tenant.SCRAMIterations} {
		b.Run("iterations="+strconv.Itoa(iterations), func(b *testing.B) {
			salt := make([]byte, 16)
			if _, err := rand.Read(salt); err != nil {
				b.Fatal(err)
			}
			verifier, err := tenant.SCRAMVerifier(cred.Password, base64.StdEncoding.EncodeToString(salt), iterations)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := super.Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", pgx.Identifier{cred.Role}.Sanitize(), verifier)); err != nil {
				b.Fatal(err)
			}
			dsn := storetest.TenantDSN(b, srv.BouncerDSN(), cred)
			before := selfCPU(b)
			b.ResetTimer()
			for range b.N {
				c, err := pgx.Connect(ctx, dsn)
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Close(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(selfCPU(b)-before)/float64(time.Millisecond)/float64(b.N), "client-CPU-ms/login")
		})
	}
}

// selfCPU is this process's user and system CPU time so far.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
