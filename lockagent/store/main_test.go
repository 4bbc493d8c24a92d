package store_test

import (
	"os"
	"testing"

	"github.com/dislock/dislock/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{Name: "store"})) }
