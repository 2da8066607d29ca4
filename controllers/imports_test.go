package controllers

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The controller reaches the data plane through runtime/engine alone: it
// imports neither the Redis shards (runtime/stock) nor the ledger
// (runtime/ledger). The engine names what the controller reads of them
// (gate names, shard states, records, error sentinels). Tests may use them
// to set up and inspect the real servers.
func TestControllerGoesThroughTheEngineAlone(t *testing.T) {
	forbidden := []string{
		"github.com/flashsale-dev/flashsale-operator/runtime/stock",
		"github.com/flashsale-dev/flashsale-operator/runtime/ledger",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range forbidden {
				if path == bad || strings.HasPrefix(path, bad+"/") {
					t.Errorf("%s imports %s: go through runtime/engine", name, path)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source file checked")
	}
}
