package gateway

import (
	"context"
	"testing"
)

// An agent newer than its gateway may send fields the gateway does not
// know: they are ignored, and the fields the gateway checks are still
// checked, whatever their case or order.
func TestACallWithFieldsTheGatewayDoesNotKnowStillRunsChecked(t *testing.T) {
	s := &Server{cfg: Config{Cluster: "dc-a"}}
	ok := `{"Key":"team/report","Window":"2026-12-06T06:00:00Z","Index":-1,"TTL":30000000000,
		"Owner":{"Cluster":"dc-a","Namespace":"team","Job":"j","JobUID":"u","Pod":"p"},"Pause":{"until":"tomorrow"}}`
	if _, err := prepareClaim(s, "team", []byte(ok)); err != nil {
		t.Fatalf("a claim with a field the gateway does not know: %v", err)
	}
	for name, body := range map[string]string{
		"another namespace's key, in another case": `{"key":"other/report","Owner":{"Cluster":"dc-a","Namespace":"team"}}`,
		"a key given twice, the last another's":    `{"Key":"team/report","Key":"other/report","Owner":{"Cluster":"dc-a","Namespace":"team"}}`,
		"trailing bytes":                           `{"Key":"team/report","Owner":{"Cluster":"dc-a","Namespace":"team"}} {"Key":"other/x"}`,
	} {
		if _, err := prepareClaim(s, "team", []byte(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A namespace whose credential is empty (a Secret key left blank) admits
// nobody, not a caller without a password.
func TestAnEmptyCredentialAdmitsNobody(t *testing.T) {
	c := StaticCredentials{"team": ""}
	if err := c.Check(context.Background(), "team", ""); err == nil {
		t.Fatal("an empty credential admitted an empty password")
	}
}
