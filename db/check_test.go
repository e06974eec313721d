package db

import (
	"path"
	"testing"
)

// Every migration has its check, in the order they apply, so a new one
// cannot be forgotten by Missing (and so by the node's start-up warning).
func TestEveryMigrationIsChecked(t *testing.T) {
	files := Migrations()
	if len(files) != len(schemaChecks) {
		t.Fatalf("%d migrations, %d checks", len(files), len(schemaChecks))
	}
	for i, f := range files {
		if got := schemaChecks[i].migration; got != path.Base(f) {
			t.Errorf("check %d is of %s, want %s", i, got, path.Base(f))
		}
	}
	if schemaChecks[0].migration != TasksMigration {
		t.Errorf("the first migration is %s, want the tasks' table", schemaChecks[0].migration)
	}
}
