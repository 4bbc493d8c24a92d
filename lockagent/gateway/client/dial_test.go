package client_test

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"

	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/test/tlstest"
)

// A bad gateway URL is refused with every problem named, and never with the
// credential in the message (it lands in the pod's termination message).
func TestABadGatewayURLNamesEveryProblemButNotTheCredential(t *testing.T) {
	const secret = "s3cr3t-Credential"
	for _, tc := range []struct{ url, want string }{
		{"https://ns:" + secret + "@gateway", "host:port is missing"},
		{"https://gateway:9445", "the namespace and its credential are missing"},
		{"https://ns@gateway:9445", "the namespace and its credential are missing"},
		{"https://ns:" + secret + "@gateway:9445/v1", `path "/v1" is not empty`},
		{"https://ns:" + secret + "@gateway:9445?sslmode=require", `parameter "sslmode" is unknown`},
		{"https://ns:" + secret + "@gateway:9445?ca=%%%", "invalid URL escape"},
		{"https://ns:" + secret + "@gateway:9445?ca=bm90IHBlbQ", `parameter "ca" holds no PEM certificate`},
		{"https://ns:" + secret + "@gateway:9445?ca=" + url.QueryEscape("not*base64"), `parameter "ca" is not base64`},
		{"https://ns:" + secret + "@gate way:9445", "invalid character"},
	} {
		_, err := client.Dial(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.url, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error shows the credential: %v", tc.url, err)
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawURLEncoding} {
		ca := tlstest.NewCA(t).CertPEM
		u := "https://ns:" + secret + "@gateway.dislock-system.svc:9445/?ca=" + url.QueryEscape(enc.EncodeToString(ca))
		if _, err := client.Dial(u); err != nil {
			t.Errorf("a good URL (ca in %v): %v", enc, err)
		}
	}
}

// FuzzDial: whatever the URL, Dial answers without panicking and never
// repeats the credential.
func FuzzDial(f *testing.F) {
	f.Add("https://ns:pw@host:1/?ca=")
	f.Add("https://ns:pw@[::1]:9445")
	f.Add("https://:pw@host:1")
	f.Add("postgres://u:pw@host:5432/db")
	f.Fuzz(func(t *testing.T, raw string) {
		_, err := client.Dial(raw)
		u, perr := url.Parse(raw)
		if err == nil || perr != nil {
			return
		}
		if p, ok := u.User.Password(); ok && len(p) >= 4 && strings.Contains(err.Error(), p) && !strings.Contains(strings.ReplaceAll(raw, p, ""), p) {
			t.Fatalf("%q: the error shows the credential: %v", raw, err)
		}
	})
}
