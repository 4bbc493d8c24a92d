package dsn

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// libpq skips exactly the characters isspace() accepts in the C locale
// between pairs and around '=': space, \t, \n, \v, \f and \r. Each of them
// separates pairs here as it does in pgx, which reads the string for the
// connection, so a string both accept means the same pairs to both.
func TestEveryBlankLibpqSkipsSeparatesPairs(t *testing.T) {
	t.Parallel()
	for _, b := range []string{" ", "\t", "\n", "\v", "\f", "\r"} {
		t.Run(blankName[b], func(t *testing.T) {
			t.Parallel()
			s := b + "host=db" + b + "user" + b + "=" + b + "app" + b + b + "password='s3 cr\\'t'" + b + "dbname=d" + b
			pairs, err := Parse(s)
			if err != nil {
				t.Fatalf("Parse(%q): %v", s, err)
			}
			got := map[string]string{}
			for _, p := range pairs {
				got[p.Key] = p.Value
			}
			want := map[string]string{"host": "db", "user": "app", "password": "s3 cr't", "dbname": "d"}
			if len(pairs) != len(want) {
				t.Fatalf("Parse(%q) = %+v, want the pairs %v", s, pairs, want)
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("Parse(%q): %s = %q, want %q", s, k, got[k], v)
				}
			}
			cfg, err := pgconn.ParseConfig(s)
			if err != nil {
				t.Fatalf("pgx does not read %q: %v", s, err)
			}
			if cfg.Host != got["host"] || cfg.User != got["user"] || cfg.Password != got["password"] || cfg.Database != got["dbname"] {
				t.Errorf("pgx reads %q as host %q user %q password %q dbname %q; Parse as %v", s, cfg.Host, cfg.User, cfg.Password, cfg.Database, got)
			}
			if scrubbed := Scrub(s, "failed: "+s); strings.Contains(scrubbed, "cr\\'t") || strings.Contains(scrubbed, "s3 cr") {
				t.Errorf("Scrub left the password in %q", scrubbed)
			}
		})
	}
}

// blankName names each blank in a subtest's name.
var blankName = map[string]string{" ": "space", "\t": "tab", "\n": "newline", "\v": "vertical tab", "\f": "form feed", "\r": "carriage return"}

// Characters outside libpq's blanks belong to the value, as they do in
// libpq: a no-break space or a vertical bar does not end it.
func TestOnlyLibpqsBlanksEndABareValue(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"\u00a0", "\x1c", "\x00", "|"} {
		pairs, err := Parse("password=a" + c + "b host=db")
		if err != nil || len(pairs) != 2 || pairs[0].Value != "a"+c+"b" {
			t.Errorf("%q inside a bare value: %+v, %v", c, pairs, err)
		}
	}
}

func TestValuesReadAsLibpqReadsThem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in  string
		raw, want string
		err       string
	}{
		{"bare", `k=v`, `v`, `v`, ""},
		{"escaped blank in a bare value", `k=a\ b`, `a\ b`, `a b`, ""},
		{"escaped quote in a quoted value", `k='it\'s'`, `it\'s`, `it's`, ""},
		{"escaped backslash", `k='a\\b'`, `a\\b`, `a\b`, ""},
		{"a trailing backslash is dropped", `k=ab\`, `ab\`, `ab`, ""},
		{"an empty quoted value", `k=''`, ``, ``, ""},
		{"an empty value takes the next word", `k= other=x`, `other=x`, `other=x`, ""},
		{"an unterminated quote", `k='abc`, `abc`, `abc`, "unterminated"},
		{"a keyword without '='", `k v`, ``, ``, `missing "=" after "k"`},
		{"a value without a keyword", `=v`, ``, ``, "without a keyword"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, _, err := readPair(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("readPair(%q) error %v, want %q", tc.in, err, tc.err)
				}
			} else if err != nil {
				t.Fatalf("readPair(%q): %v", tc.in, err)
			}
			if p.Raw != tc.raw || p.Value != tc.want {
				t.Errorf("readPair(%q) = raw %q value %q, want raw %q value %q", tc.in, p.Raw, p.Value, tc.raw, tc.want)
			}
		})
	}
}

// Quote renders any value so that it reads back the same.
func TestQuotedValuesReadBack(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "plain", "two words", "it's", `back\slash`, "tab\there", "\v\f\r\n", "'", `\`} {
		pairs, err := Parse("k=" + Quote(v) + " next=1")
		if err != nil || len(pairs) != 2 || pairs[0].Value != v {
			t.Errorf("Quote(%q) = %s reads back as %+v, %v", v, Quote(v), pairs, err)
		}
	}
}

// A password is scrubbed from a message even when the string around it is
// too broken for the driver to read, and sslpassword (the client key's
// passphrase, not the login's) is not mistaken for it.
func TestScrubFindsThePasswordOfABrokenString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, secret string }{
		{"host=db password=s3cr3t sslmode=sometimes", "s3cr3t"},
		{"host='unterminated password = 'two words", "two words"},
		{"password='two words' host=db", "words"},
		{"postgres://app:s3cr3t@db/app?sslmode=x", "s3cr3t"},
		// libpq ends the value at \v or \f; the rest was typed as the
		// password too, and the driver names it as a broken keyword.
		{"password=SEC\vRETRET sslmode=bogus", "RETRET"},
		{"password=SEC\fRETRET", "RETRET"},
	} {
		if got := Scrub(tc.dsn, "error: "+tc.dsn); strings.Contains(got, tc.secret) {
			t.Errorf("Scrub(%q) left %q: %s", tc.dsn, tc.secret, got)
		}
	}
	if got := Scrub("sslpassword=keypass host=db", "keypass"); got != "keypass" {
		t.Errorf("Scrub took sslpassword's value for the login's: %q", got)
	}
}
