// Package dsn reads libpq connection strings for lockagent/store and its
// owner-only subpackages: the one reader of the key=value form, which the
// store's messages, its CA settings and the tenants' connection strings all
// go through, and the scrubbing of passwords from messages.
package dsn

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// blanks are the characters libpq's conninfo_parse skips with isspace() in
// the C locale, which pgx reads the same way: space, \t, \n, \v, \f and
// \r. They separate the pairs of a key=value string and may surround '='.
const blanks = " \t\n\v\f\r"

// IsBlank reports one of the blanks of a key=value connection string.
func IsBlank(c byte) bool { return strings.IndexByte(blanks, c) >= 0 }

// Pair is one keyword=value of a key=value connection string.
type Pair struct {
	Key string
	// Raw is the value as written, without its quotes: backslash escapes
	// kept.
	Raw string
	// Value is the value as libpq reads it.
	Value string
}

// readPair reads the pair s starts with (s starts with no blank) the way
// libpq's conninfo_parse does: the keyword runs to '=' or a blank; blanks
// may stand around '='; a value is quoted with ' or bare, ending at a
// blank; a backslash takes the next character literally. It returns the
// rest of s after the value. A string broken at this pair is an error: a
// keyword without '=' returns no pair; a quoted value without its closing
// quote returns the pair with the value read to the end of s.
func readPair(s string) (Pair, string, error) {
	k := 0
	for k < len(s) && s[k] != '=' && !IsBlank(s[k]) {
		k++
	}
	key := s[:k]
	rest := strings.TrimLeft(s[k:], blanks)
	if !strings.HasPrefix(rest, "=") {
		return Pair{}, "", fmt.Errorf("missing \"=\" after %q in the key=value connection string", key)
	}
	if key == "" {
		return Pair{}, "", errors.New("a value without a keyword in the key=value connection string")
	}
	rest = strings.TrimLeft(rest[1:], blanks)
	quoted := strings.HasPrefix(rest, "'")
	if quoted {
		rest = rest[1:]
	}
	var raw, value strings.Builder
	i := 0
	for ; i < len(rest); i++ {
		c := rest[i]
		if quoted && c == '\'' || !quoted && IsBlank(c) {
			break
		}
		raw.WriteByte(c)
		if c == '\\' {
			if i++; i == len(rest) {
				break // a trailing backslash escapes the end: libpq drops it
			}
			raw.WriteByte(rest[i])
			c = rest[i]
		}
		value.WriteByte(c)
	}
	p := Pair{Key: key, Raw: raw.String(), Value: value.String()}
	switch {
	case quoted && i >= len(rest):
		return p, "", errors.New("an unterminated quoted value in the key=value connection string")
	case i < len(rest):
		i++ // the closing quote, or the blank that ended a bare value
	}
	return p, rest[min(i, len(rest)):], nil
}

// Parse reads every pair of a key=value connection string, in order; a
// keyword may repeat, and then libpq takes the last value. On error it
// returns the pairs before the broken one.
func Parse(s string) ([]Pair, error) {
	var out []Pair
	for s = strings.TrimLeft(s, blanks); s != ""; s = strings.TrimLeft(s, blanks) {
		p, rest, err := readPair(s)
		if err != nil {
			return out, err
		}
		out = append(out, p)
		s = rest
	}
	return out, nil
}

// Quote renders v as a key=value connection string value: bare when that
// reads back the same, else quoted.
func Quote(v string) string {
	if v != "" && !strings.ContainsAny(v, blanks+`'\`) {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// CutURLScheme splits a postgres:// or postgresql:// URL after its scheme;
// ok is false for a key=value string.
func CutURLScheme(dsn string) (scheme, rest string, ok bool) {
	for _, p := range []string{"postgresql://", "postgres://"} {
		if rest, ok := strings.CutPrefix(dsn, p); ok {
			return p, rest, true
		}
	}
	return "", "", false
}

// passwords finds the values of password keywords in a key=value
// connection string the way libpq reads them, even when the rest of the
// string is broken: each "password" that starts a word is read as a pair.
// It returns each value as written and unescaped, and the words of a value
// with blanks: a driver's own redaction may have masked its first word
// only.
func passwords(conn string) []string {
	var out []string
	for i := 0; ; {
		j := strings.Index(conn[i:], "password")
		if j < 0 {
			return out
		}
		start := i + j
		i = start + len("password")
		if start > 0 && !IsBlank(conn[start-1]) {
			continue // sslpassword's value is the key's, not the login's
		}
		p, _, _ := readPair(conn[start:])
		if p.Key != "password" {
			continue
		}
		out = append(out, p.Raw, p.Value)
		if words := strings.Fields(p.Value); len(words) > 1 {
			out = append(out, words...)
		}
		// \v and \f end an unquoted value for libpq, not for whoever typed
		// it: what follows up to a space, a tab or a line end was meant as
		// the password too.
		if v := strings.TrimLeft(conn[i:], blanks+"="); !strings.HasPrefix(v, "'") {
			if end := strings.IndexAny(v, " \t\n\r"); end >= 0 {
				v = v[:end]
			}
			if v != "" && v != p.Raw {
				out = append(out, v)
			}
		}
	}
}

// Scrub removes any password the connection string carries from msg. pgx
// already redacts what it recognises; this also covers strings too broken
// for its redaction to find the password.
func Scrub(databaseURL, msg string) string {
	var secrets []string
	if u, err := url.Parse(databaseURL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	if i := strings.Index(databaseURL, "://"); i >= 0 {
		rest := databaseURL[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if colon := strings.Index(rest[:at], ":"); colon >= 0 {
				secrets = append(secrets, rest[colon+1:at])
			}
		}
	}
	secrets = append(secrets, passwords(databaseURL)...)
	// Longest first: a secret that holds another is replaced whole.
	slices.SortStableFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}
