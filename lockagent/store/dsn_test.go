package store_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
)

func TestDatabaseURLDefaultsToExecModeUnlessItChoosesOne(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, url string
		want      pgx.QueryExecMode
	}{
		{"a plain URL uses unnamed statements", "postgres://u:p@db:6432/app", pgx.QueryExecModeExec},
		{"a URL may choose simple protocol", "postgres://u:p@db:6432/app?default_query_exec_mode=simple_protocol", pgx.QueryExecModeSimpleProtocol},
		{"a URL may choose cached statements", "postgresql://u:p@db/app?default_query_exec_mode=cache_statement", pgx.QueryExecModeCacheStatement},
		{"key=value form", "host=db port=6432 user=u password=p dbname=app", pgx.QueryExecModeExec},
		{"key=value form choosing describe_exec", "host=db user=u default_query_exec_mode=describe_exec", pgx.QueryExecModeDescribeExec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := store.ParseDatabaseURL(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.ConnConfig.DefaultQueryExecMode; got != tc.want {
				t.Fatalf("exec mode %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBadDatabaseURLsAreExplainedWithoutThePassword(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, url, want string }{
		{"empty", "", "DISLOCK_DATABASE_URL"},
		{"bad port", "postgres://app:s3cr3t-pw@db:notaport/app", "invalid database URL"},
		{"bad exec mode", "postgres://app:s3cr3t-pw@db/app?default_query_exec_mode=fast", "default_query_exec_mode"},
		{"broken escape", "postgres://app:s3cr3t-pw%zz@db/app", "invalid database URL"},
		{"key=value with bad sslmode", "host=db password=s3cr3t-pw sslmode=sometimes", "sslmode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := store.ParseDatabaseURL(tc.url)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("error echoes the password: %q", err)
			}
		})
	}
}

func TestUnreachableDatabaseErrorNamesHostAndCause(t *testing.T) {
	t.Parallel()
	addr := "127.0.0.1:" + strconv.Itoa(storetest.ClosedPort(t)) // refuses connections
	s, err := store.Open(context.Background(), "postgres://app:s3cr3t-pw@"+addr+"/app?connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Ping(context.Background())
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ping: %v, want ErrUnavailable", err)
	}
	for _, want := range []string{addr, "refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("error echoes the password: %q", err)
	}
}

func FuzzParseDatabaseURL(f *testing.F) {
	f.Add("postgres://", "u", "h:5432", "d?sslmode=disable")
	f.Add("postgres://", "u", "h:x", "d")
	f.Add("postgresql://", "u", "[::1]:1", "d?default_query_exec_mode=nope")
	f.Add("host=h user=", "u", " port=x", "")
	f.Add("", "", "", "")
	f.Fuzz(func(t *testing.T, scheme, user, host, rest string) {
		const password = "Zq7pW9xK"
		var dsn string
		if strings.Contains(scheme, "://") {
			dsn = scheme + user + ":" + password + "@" + host + "/" + rest
		} else {
			dsn = scheme + user + " password=" + password + " host=" + host + " " + rest
		}
		cfg, err := store.ParseDatabaseURL(dsn)
		if err == nil && cfg == nil {
			t.Fatal("nil config without error")
		}
		if err != nil && strings.Contains(err.Error(), password) && !strings.Contains(scheme+user+host+rest, password) {
			t.Fatalf("error echoes the password: %q", err)
		}
	})
}

// A multi-host URL (the nodes of an HA cluster, first writable one wins) is
// accepted in both forms, and errors name every host it tries.
func TestMultiHostURLsNameEveryHost(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://u:p@pg-a:5432,pg-b:5433/app?target_session_attrs=read-write",
		"host=pg-a,pg-b port=5432,5433 user=u password=p dbname=app target_session_attrs=read-write",
	} {
		s, err := store.Open(context.Background(), url, store.Options{})
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if got := s.Addr(); got != "pg-a:5432,pg-b:5433" {
			t.Errorf("%s: Addr() = %q", url, got)
		}
		s.Close()
	}
}
