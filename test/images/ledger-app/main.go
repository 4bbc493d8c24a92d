// Command ledger-app is the application of the end-to-end tests' CronJobs.
// Each run appends one row to a ledger table in PostgreSQL (the window it was
// given, its fencing token, its cluster and pod, and the database time it
// started) and, when it ends, the database time it finished, so that a test
// can count runs per window and check that no two runs overlapped. The
// pods use the host network, so the database is on 127.0.0.1.
//
// Environment: LEDGER_DATABASE_URL (required), LEDGER_CLUSTER, LEDGER_NAMESPACE, LEDGER_POD,
// LEDGER_SLEEP (a Go duration to work for), LEDGER_EXIT (the exit code),
// LEDGER_SHUTDOWN (a Go duration: how long the app goes on after SIGTERM,
// as one that finishes the work in hand before it stops, so that its pod
// stays Terminating that long); DISLOCK_WINDOW and DISLOCK_FENCING_TOKEN
// come from the dislock wrapper, JOB_COMPLETION_INDEX from the Job
// controller (Indexed Jobs only).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	insertRun = `INSERT INTO e2e.ledger (window_start, job_index, token, cluster, namespace, pod, started_at)
VALUES ($1, $2, $3, $4, $5, $6, now()) RETURNING id`
	finishRun = `UPDATE e2e.ledger SET finished_at = now(), exit_code = $2 WHERE id = $1`
)

// callTimeout bounds each statement, so that a lost database ends the run
// with an error instead of hanging it.
const callTimeout = 10 * time.Second

func main() { os.Exit(run()) }

func run() int {
	dsn := os.Getenv("LEDGER_DATABASE_URL")
	if dsn == "" {
		fmt.Fprintln(os.Stderr, "ledger-app: LEDGER_DATABASE_URL is not set")
		return 64
	}
	work, err := durationEnv("LEDGER_SLEEP")
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger-app:", err)
		return 64
	}
	shutdown, err := durationEnv("LEDGER_SHUTDOWN")
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger-app:", err)
		return 64
	}
	// NULL unless the pod is one of an Indexed Job's.
	var index *int
	if s := os.Getenv("JOB_COMPLETION_INDEX"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ledger-app: JOB_COMPLETION_INDEX=%q is not a number\n", s)
			return 64
		}
		index = &n
	}
	exitCode := 0
	if s := os.Getenv("LEDGER_EXIT"); s != "" {
		if exitCode, err = strconv.Atoi(s); err != nil {
			fmt.Fprintf(os.Stderr, "ledger-app: LEDGER_EXIT=%q is not a number\n", s)
			return 64
		}
	}
	token, _ := strconv.ParseInt(os.Getenv("DISLOCK_FENCING_TOKEN"), 10, 64)

	var id int64
	err = exec(func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, insertRun, os.Getenv("DISLOCK_WINDOW"), index, token,
			os.Getenv("LEDGER_CLUSTER"), os.Getenv("LEDGER_NAMESPACE"), os.Getenv("LEDGER_POD")).Scan(&id)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger-app: recording the start:", err)
		return 1
	}
	fmt.Printf("ledger-app: run %d window=%s token=%d cluster=%s working %v\n",
		id, os.Getenv("DISLOCK_WINDOW"), token, os.Getenv("LEDGER_CLUSTER"), work)

	// Stopped early (the wrapper passes on SIGTERM when the lease is lost):
	// still record the end, which is what the overlap check reads.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-time.After(work):
	case s := <-stop:
		fmt.Printf("ledger-app: run %d stopped by %v; shutting down for %v\n", id, s, shutdown)
		time.Sleep(shutdown)
		exitCode = 143
	}
	err = exec(func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, finishRun, id, exitCode)
		return err
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger-app: recording the end:", err)
		return 1
	}
	return exitCode
}

// exec runs f on a fresh connection: one statement per connection keeps the
// app correct behind PgBouncer in transaction mode.
func exec(f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(os.Getenv("LEDGER_DATABASE_URL"))
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return f(ctx, c)
}

func durationEnv(name string) (time.Duration, error) {
	s := os.Getenv(name)
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a duration (want e.g. \"2s\")", name, s)
	}
	return d, nil
}
