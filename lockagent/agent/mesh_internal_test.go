package agent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The quit client connects only to loopback addresses, whatever a name in
// the URL resolves to, and never through a proxy from the environment.
func TestTheQuitClientReachesOnlyTheLoopback(t *testing.T) {
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:9") // would refuse every request if used
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	client := &http.Client{Transport: loopbackOnly()}
	resp, err := client.Post(srv.URL+"/quitquitquit", "", nil)
	if err != nil {
		t.Fatalf("the loopback: %v", err)
	}
	resp.Body.Close()
	for _, u := range []string{"http://192.0.2.1:15020/quitquitquit", "http://[2001:db8::1]:15020/quitquitquit"} {
		_, err := client.Post(u, "", nil)
		if err == nil || !strings.Contains(err.Error(), "is not a loopback address") {
			t.Errorf("POST %s: %v; want a refusal before connecting", u, err)
		}
	}
}
