package store_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/test/tlstest"
)

// A database behind a private CA: the owner's URL verifies it with the file
// the webhook was given (--database-ca-file) unless the URL chose otherwise.
func TestWithRootCAVerifiesWithTheGivenCAUnlessTheURLChose(t *testing.T) {
	t.Parallel()
	ca := filepath.Join(t.TempDir(), "ca dir", "ca.crt")
	if err := os.MkdirAll(filepath.Dir(ca), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, tlstest.NewCA(t).CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	escaped := strings.ReplaceAll(url.QueryEscape(ca), "+", "%20")
	for _, tc := range []struct {
		name, url, want string
	}{
		{"a URL without TLS settings verifies the full name with the CA",
			"postgres://app:s3cr3t-pw@db:6432/app", "postgres://app:s3cr3t-pw@db:6432/app?sslmode=verify-full&sslrootcert=" + escaped},
		{"a URL's other parameters stay as written",
			"postgresql://app:s3cr3t-pw@db/app?connect_timeout=5&application_name=x", "postgresql://app:s3cr3t-pw@db/app?connect_timeout=5&application_name=x&sslmode=verify-full&sslrootcert=" + escaped},
		{"a URL that chose its mode keeps it",
			"postgres://app:s3cr3t-pw@db/app?sslmode=verify-ca", "postgres://app:s3cr3t-pw@db/app?sslmode=verify-ca&sslrootcert=" + escaped},
		{"a URL that names its own root certificate keeps it",
			"postgres://app:s3cr3t-pw@db/app?sslrootcert=" + escaped + "&sslmode=require", "postgres://app:s3cr3t-pw@db/app?sslrootcert=" + escaped + "&sslmode=require"},
		{"key=value: defaults go first, where the string's own values win",
			"host=db user=app password=s3cr3t-pw sslmode=verify-ca", "sslmode=verify-full sslrootcert='" + ca + "' host=db user=app password=s3cr3t-pw sslmode=verify-ca"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := store.WithRootCA(tc.url, ca)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if _, err := store.ParseDatabaseURL(got); err != nil {
				t.Fatalf("the result does not parse: %v", err)
			}
		})
	}
	t.Run("no CA file leaves the URL alone", func(t *testing.T) {
		t.Parallel()
		if got, err := store.WithRootCA("postgres://app:p@db/app", ""); err != nil || got != "postgres://app:p@db/app" {
			t.Fatalf("got %q, %v", got, err)
		}
	})
	t.Run("a bad URL is explained without the password", func(t *testing.T) {
		t.Parallel()
		_, err := store.WithRootCA("postgres://app:s3cr3t-pw@db:notaport/app", ca)
		if err == nil || !strings.Contains(err.Error(), "invalid database URL") || strings.Contains(err.Error(), "s3cr3t") {
			t.Fatalf("error %v", err)
		}
	})
}

// A careless operator gives --database-ca-file, believing every connection
// now verifies the server, but keeps the sslmode=prefer (psql's and pgx's
// default, common in copied URLs) in --database-url. WithRootCA keeps the
// chosen mode, and pgx under prefer/allow skips verification entirely and
// falls back to plain text: the CA is silently unused, for the owner's
// connection and (since ReplaceRootCA keeps the mode too) every tenant URL
// the webhook writes. The combination is refused at start.
func TestACAWithAURLModeThatSkipsVerificationIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, tlstest.NewCA(t).CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"prefer", "allow", "disable"} {
		t.Run(mode, func(t *testing.T) {
			_, err := store.WithRootCA("postgres://dislock:s3cret@db.internal:5432/dislock?sslmode="+mode, caFile)
			if err == nil || !strings.Contains(err.Error(), "sslmode="+mode) || !strings.Contains(err.Error(), "verify-full") || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("with --database-ca-file and sslmode=%s: %v; want a refusal naming the mode and verify-full, without the password", mode, err)
			}
		})
	}
}

// The sidecar reads the CA where its volume is mounted, whatever path the
// owner's URL named in the webhook's pod.
func TestReplaceRootCANamesTheSidecarsPath(t *testing.T) {
	t.Parallel()
	const mount = "/var/run/dislock/database-ca/ca.crt"
	for _, tc := range []struct{ name, url, want string }{
		{"the owner's path is replaced, its mode kept",
			"postgres://t:pw@db/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fdislock%2Fdatabase-ca%2Fca.crt&connect_timeout=5",
			"postgres://t:pw@db/app?sslmode=verify-full&connect_timeout=5&sslrootcert=%2Fvar%2Frun%2Fdislock%2Fdatabase-ca%2Fca.crt"},
		{"a URL without TLS settings verifies the full name",
			"postgres://t:pw@db/app", "postgres://t:pw@db/app?sslmode=verify-full&sslrootcert=%2Fvar%2Frun%2Fdislock%2Fdatabase-ca%2Fca.crt"},
		{"key=value: the replacement goes last, where it wins",
			"host=db sslrootcert=/etc/x.crt user=t password=pw", "sslmode=verify-full host=db sslrootcert=/etc/x.crt user=t password=pw sslrootcert=" + mount},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := store.ReplaceRootCA(tc.url, mount)
			if err != nil || got != tc.want {
				t.Fatalf("got  %s (%v)\nwant %s", got, err, tc.want)
			}
		})
	}
}

// A database that requires TLS from a private CA: claims and leases work
// directly and through PgBouncer when the URL verifies the server with the
// CA; a URL trusting another CA fails naming the certificate check, and a
// client that does not encrypt is refused.
func TestTLSDatabaseWithPrivateCA(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "tls", TLS: true})
	// The harness's URLs carry the CA already; start from plain ones, as
	// an operator's --database-url does, and add the CA as the webhook does.
	plain := []pgtest.Target{
		{Name: "direct", DSN: pgtest.DSN(pgtest.AppUser, pgtest.AppPassword, portOf(t, srv.DirectDSN()))},
		{Name: "pgbouncer", DSN: pgtest.DSN(pgtest.AppUser, pgtest.AppPassword, portOf(t, srv.BouncerDSN()))},
	}
	otherCA := filepath.Join(t.TempDir(), "other-ca.crt")
	if err := os.WriteFile(otherCA, tlstest.NewCA(t).CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tg := range plain {
		t.Run(tg.Name, func(t *testing.T) {
			noMode := strings.TrimSuffix(tg.DSN, "?sslmode=disable")
			t.Run("claims and leases work verifying the server with the CA", func(t *testing.T) {
				dsn, err := store.WithRootCA(noMode, srv.CAFile())
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(dsn, "sslmode=verify-full") {
					t.Fatalf("URL %s does not verify the full name", dsn)
				}
				s := storetest.Open(t, dsn, 2)
				key := storetest.UniqueKey(t)
				a := storetest.Owner("dc-a", "job-a", "pod-a")
				storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, false, ttl, store.Claimed)
				if _, err := storetest.Claim(t, s, key, storetest.WindowAt(0), storetest.Owner("dc-b", "job-b", "pod-b"), false, ttl); !errors.Is(err, store.ErrWindowTaken) {
					t.Fatalf("second cluster's claim: %v, want ErrWindowTaken", err)
				}
				ctx := context.Background()
				g, err := s.AcquireLease(ctx, key, a, ttl)
				if err != nil {
					t.Fatalf("acquire: %v", err)
				}
				if _, _, err := s.RenewLease(ctx, key, g.Lease.Token, ttl); err != nil {
					t.Fatalf("renew: %v", err)
				}
				if ok, err := s.ReleaseLease(ctx, key, g.Lease.Token); err != nil || !ok {
					t.Fatalf("release: %v, %v", ok, err)
				}
			})
			t.Run("another CA fails naming the certificate check, never the password", func(t *testing.T) {
				dsn, err := store.WithRootCA(noMode, otherCA)
				if err != nil {
					t.Fatal(err)
				}
				err = pingErr(t, dsn)
				if err == nil || !strings.Contains(err.Error(), "certificate") {
					t.Fatalf("error %v, want one naming the certificate", err)
				}
				if strings.Contains(err.Error(), pgtest.AppPassword) {
					t.Fatalf("error echoes the password: %v", err)
				}
			})
			t.Run("a client that does not encrypt is refused", func(t *testing.T) {
				err := pingErr(t, tg.DSN)
				if err == nil {
					t.Fatal("sslmode=disable connected")
				}
				if strings.Contains(err.Error(), pgtest.AppPassword) {
					t.Fatalf("error echoes the password: %v", err)
				}
				t.Logf("refused as expected: %v", err)
			})
		})
	}
}

// pingErr is the error of a first statement over dsn.
func pingErr(t *testing.T, dsn string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := store.Open(ctx, dsn, store.Options{MaxConns: 1})
	if err != nil {
		return err
	}
	defer s.Close()
	_, err = s.Now(ctx)
	return err
}

// portOf is the port of a pgtest URL.
func portOf(t *testing.T, dsn string) int {
	t.Helper()
	cfg, err := store.ParseDatabaseURL(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return int(cfg.ConnConfig.Port)
}
