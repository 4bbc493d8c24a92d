package spec

import (
	"reflect"
	"strings"
	"testing"
)

func FuzzFromAnnotations(f *testing.F) {
	f.Add(uint8(0xff), "schedule,lease", "report", "30s", "true", "10m", `["/app/run"]`, "dislock.io/status", "{}", "team-a", "report")
	f.Add(uint8(0x01), "sometimes", "", "5", "", "", "", "dislock.io/leasettl", "30s", "team-a", "report")
	f.Add(uint8(0x07), "lease", "Report/x", "1h0m0s", "yes", "-1s", "null", "", "", "", "")
	f.Add(uint8(0x3f), " lease , schedule ", "a.b-c", "5s", "FALSE", "24h", `["a", ""]`, "example.com/x", "y", "ns", "-bad")
	f.Add(uint8(0x21), "schedule", "", "", "", "", `["\u0000"]`, "dislock.io/", "", "team-a", "report")
	f.Fuzz(func(t *testing.T, present uint8, mode, key, ttl, standby, catchup, entrypoint, extraKey, extraValue, namespace, cronJobName string) {
		a := map[string]string{}
		for i, kv := range [][2]string{
			{AnnotationMode, mode}, {AnnotationKey, key}, {AnnotationLeaseTTL, ttl},
			{AnnotationStandby, standby}, {AnnotationCatchup, catchup}, {AnnotationEntrypoint, entrypoint},
		} {
			if present&(1<<i) != 0 {
				a[kv[0]] = kv[1]
			}
		}
		if present&(1<<6) != 0 {
			a[extraKey] = extraValue
		}

		s, err := FromAnnotations(a, namespace, cronJobName)
		if err != nil {
			if !reflect.DeepEqual(s, Spec{}) {
				t.Fatalf("FromAnnotations returned %+v with error %v", s, err)
			}
			for _, fe := range FieldErrors(err) {
				if !strings.HasPrefix(fe.Annotation, Prefix) || fe.Problem == "" || fe.Error() == "" {
					t.Fatalf("malformed FieldError %+v", fe)
				}
			}
			return
		}
		if !Enabled(a) {
			t.Fatalf("FromAnnotations accepted %v, which Enabled says does not ask for dislock", a)
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("FromAnnotations(%v) = %+v, which does not validate: %v", a, s, err)
		}
		if k := s.Key(); k != namespace+"/"+s.Name || strings.Count(k, "/") != 1 {
			t.Fatalf("Key() = %q", k)
		}
		again, err := FromAnnotations(s.Annotations(), namespace, "unrelated")
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("re-parsing %v: %+v, %v; want %+v", s.Annotations(), again, err, s)
		}
	})
}
