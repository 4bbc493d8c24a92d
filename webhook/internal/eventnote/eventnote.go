// Package eventnote fits the note of a Kubernetes Event to what the API
// server accepts, for the controllers and loops that put Events on users'
// objects.
package eventnote

import "unicode/utf8"

// Max is the longest note events.k8s.io/v1 accepts (bytes).
const Max = 1024

// Cut shortens s to an Event's note size on a rune boundary.
func Cut(s string) string {
	if len(s) <= Max {
		return s
	}
	const mark = "…"
	cut := Max - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
