package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/user"
	"time"

	"github.com/dislock/dislock/lockagent/store/pause"
)

// pauseFlags are what `pause` and `resume` take besides the key.
type pauseFlags struct {
	key    string
	by     string
	reason string
	For    time.Duration
	until  string
}

func setupPause(fs *flag.FlagSet) func(context.Context, *common) error {
	f := &pauseFlags{}
	fs.StringVar(&f.key, "key", "", "lock key <namespace>/<name> to pause in every cluster (required)")
	fs.StringVar(&f.reason, "reason", "", fmt.Sprintf("why, shown in every skipped pod's reason and in `paused` (at most %d bytes)", pause.MaxReasonBytes))
	fs.DurationVar(&f.For, "for", 0, "end the pause by itself after this `duration` of database time, e.g. 2h (default: until resumed)")
	fs.StringVar(&f.until, "until", "", "end the pause by itself at this RFC 3339 time, e.g. 2026-12-07T06:00:00Z (instead of --for)")
	fs.StringVar(&f.by, "by", "", "who pauses, as the pods' reasons name them (default: $USER)")
	return func(ctx context.Context, c *common) error {
		r, err := f.request()
		if err != nil {
			return err
		}
		p, err := pause.Set(ctx, c.store, r)
		if err != nil {
			return err
		}
		return printPause(c, p)
	}
}

// request checks the flags and spells the pause they ask for.
func (f *pauseFlags) request() (pause.Request, error) {
	var errs []error
	if err := validKey(f.key, true); err != nil {
		errs = append(errs, err)
	}
	r := pause.Request{Key: f.key, By: whoRuns(f.by), Reason: f.reason, For: f.For}
	if f.until != "" {
		t, err := time.Parse(time.RFC3339, f.until)
		if err != nil {
			errs = append(errs, fmt.Errorf("--until %q is not an RFC 3339 time (want e.g. 2026-12-07T06:00:00Z)", f.until))
		}
		r.Until = &t
	}
	if f.until != "" && f.For != 0 {
		errs = append(errs, errors.New("--for and --until both end the pause: give one"))
	}
	if f.For < 0 || f.For > 0 && f.For < pause.MinFor {
		errs = append(errs, fmt.Errorf("--for %s is shorter than %s (leave it out to pause until resumed)", f.For, pause.MinFor))
	}
	if len(f.reason) > pause.MaxReasonBytes {
		errs = append(errs, fmt.Errorf("--reason has %d bytes, more than %d", len(f.reason), pause.MaxReasonBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return pause.Request{}, usageError{err}
	}
	return r, nil
}

// whoRuns is --by, or the operating system's user.
func whoRuns(by string) string {
	if by != "" {
		return by
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "unknown"
}

func setupResume(fs *flag.FlagSet) func(context.Context, *common) error {
	key := fs.String("key", "", "lock key <namespace>/<name> to resume in every cluster (required)")
	by := fs.String("by", "", "who resumes (default: $USER)")
	return func(ctx context.Context, c *common) error {
		if err := validKey(*key, true); err != nil {
			return err
		}
		p, ok, err := pause.Resume(ctx, c.store, *key, whoRuns(*by))
		if err != nil {
			return err
		}
		return printResumed(c, *key, p, ok)
	}
}

func setupPaused(fs *flag.FlagSet) func(context.Context, *common) error {
	sc := addScope(fs)
	return func(ctx context.Context, c *common) error {
		if err := sc.validate(); err != nil {
			return err
		}
		prefix := sc.key
		if prefix == "" && sc.namespace != "" {
			prefix = sc.namespace + "/"
		}
		ps, dbNow, err := pause.Active(ctx, c.store, prefix)
		if err != nil {
			return err
		}
		out := make([]pause.Pause, 0, len(ps))
		for _, p := range ps {
			if sc.covers(p.Key) {
				out = append(out, p)
			}
		}
		return printPaused(c, out, dbNow)
	}
}

func printPause(c *common, p pause.Pause) error {
	return c.print(p, func(t *table) {
		t.line("%s is %s: no run of it starts in any cluster (a run already going goes on)", p.Key, p.Text())
	})
}

func printResumed(c *common, key string, p pause.Pause, ok bool) error {
	res := struct {
		Key     string       `json:"key"`
		Resumed bool         `json:"resumed"`
		Pause   *pause.Pause `json:"pause,omitempty"`
	}{Key: key, Resumed: ok}
	if ok {
		res.Pause = &p
	}
	return c.print(res, func(t *table) {
		if !ok {
			t.line("%s was not paused: nothing to resume", key)
			return
		}
		t.line("resumed %s (%s, since %s): its next window runs", key, p.Text(), p.PausedAt.Format(time.RFC3339))
	})
}

func printPaused(c *common, ps []pause.Pause, dbNow time.Time) error {
	return c.print(ps, func(t *table) {
		if len(ps) == 0 {
			t.line("no key is paused")
			return
		}
		t.row("KEY", "PAUSED", "BY", "UNTIL", "REASON")
		for _, p := range ps {
			until := "resumed"
			if p.Until != nil {
				until = p.Until.Format(time.RFC3339) + " (in " + p.Until.Sub(dbNow).Round(time.Second).String() + ")"
			}
			t.row(p.Key, p.PausedAt.Format(time.RFC3339)+" ("+dbNow.Sub(p.PausedAt).Round(time.Second).String()+" ago)", p.PausedBy, until, p.Reason)
		}
	})
}
