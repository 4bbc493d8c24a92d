package cli

import (
	"flag"
	"fmt"
	"strings"
)

// scope is the --key and --namespace flags of a listing: one key, one
// namespace's keys, or every key.
type scope struct {
	key, namespace string
}

func addScope(fs *flag.FlagSet) *scope {
	s := &scope{}
	fs.StringVar(&s.key, "key", "", "only this lock key <namespace>/<name>")
	fs.StringVar(&s.namespace, "namespace", "", "only the keys of this namespace")
	return s
}

// validate checks the flags; every problem is a usage error naming its flag.
func (s *scope) validate() error {
	if err := validKey(s.key, false); err != nil {
		return err
	}
	if s.namespace != "" && (strings.ContainsAny(s.namespace, "/#") || strings.TrimSpace(s.namespace) != s.namespace) {
		return usageError{fmt.Errorf("--namespace %q is not a namespace name", s.namespace)}
	}
	if s.key != "" && s.namespace != "" && !strings.HasPrefix(s.key, s.namespace+"/") {
		return usageError{fmt.Errorf("--key %q is not a key of --namespace %q (want %s/<name>)", s.key, s.namespace, s.namespace)}
	}
	return nil
}

// covers reports whether key is in the scope.
func (s *scope) covers(key string) bool {
	return (s.key == "" || key == s.key) && (s.namespace == "" || strings.HasPrefix(key, s.namespace+"/"))
}
