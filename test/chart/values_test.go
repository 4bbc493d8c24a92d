package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// Every value the chart defines (values.schema.json's properties) is in
// values.yaml with a comment right above it, and values.yaml has no key the
// schema does not define. Free-form values (resources, affinity, ...) are
// documented as a whole.
func TestEveryValueIsDocumented(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{} // path -> has properties of its own
	var walk func(node map[string]any, path string)
	walk = func(node map[string]any, path string) {
		if ref, ok := node["$ref"].(string); ok {
			node = schema["definitions"].(map[string]any)[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
		}
		props, ok := node["properties"].(map[string]any)
		if path != "" {
			defined[path] = ok
		}
		for k, v := range props {
			if k != "global" {
				walk(v.(map[string]any), strings.TrimPrefix(path+"."+k, "."))
			}
		}
	}
	walk(schema, "")

	text, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	key := regexp.MustCompile(`^( *)([A-Za-z][A-Za-z0-9]*):`)
	var stack []string
	seen := map[string]bool{}
	prev := ""
	for n, line := range strings.Split(string(text), "\n") {
		m := key.FindStringSubmatch(line)
		if m != nil {
			depth := len(m[1]) / 2
			stack = append(stack[:min(depth, len(stack))], m[2])
			path := strings.Join(stack, ".")
			parent := strings.Join(stack[:len(stack)-1], ".")
			if parent == "" || defined[parent] {
				if _, ok := defined[path]; !ok {
					t.Errorf("values.yaml:%d: %s is not in values.schema.json", n+1, path)
				}
				if !strings.HasPrefix(strings.TrimSpace(prev), "#") {
					t.Errorf("values.yaml:%d: %s has no comment above it", n+1, path)
				}
				seen[path] = true
			}
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	var missing []string
	for p := range defined {
		if !seen[p] {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("values.schema.json defines values that values.yaml does not show: %v", missing)
	}
}
