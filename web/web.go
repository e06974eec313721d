// Package web serves what pushd gives browsers besides the protocol: the
// JavaScript client at /client/ and the demo page with its task simulator
// at /demo/, both embedded in the binary.
package web

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"

	"github.com/pushd/pushd/internal/httperr"
)

//go:embed client demo
var files embed.FS

// Client serves the JavaScript client and its TypeScript declarations
// (pushd.js and pushd.d.ts), with the /client prefix stripped. They are
// served in every mode: a product page imports the client from the node it
// talks to.
func Client() http.Handler {
	return static(sub("client"))
}

func sub(dir string) fs.FS {
	f, err := fs.Sub(files, dir)
	if err != nil {
		panic(err) // the directory is embedded above; only a broken build gets here
	}
	return f
}

// static serves embedded files with the types browsers need for modules,
// revalidated on every load: embedded files carry no modification time, so
// without no-cache a browser could keep an old client after an upgrade.
func static(f fs.FS) http.Handler {
	files := http.FileServerFS(f)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Answer a missing file (or a directory without index.html, which
		// FileServer would list) with pushd's JSON error, not FileServer's text.
		name := strings.TrimPrefix(r.URL.Path, "/")
		if name == "" || strings.HasSuffix(name, "/") {
			name += "index.html"
		}
		if st, err := fs.Stat(f, name); err != nil || st.IsDir() {
			httperr.Write(w, http.StatusNotFound, httperr.NotFound, "no such file")
			return
		}
		h := w.Header()
		switch {
		case strings.HasSuffix(r.URL.Path, ".js"):
			h.Set("Content-Type", "text/javascript; charset=utf-8")
		case strings.HasSuffix(r.URL.Path, ".d.ts"):
			h.Set("Content-Type", "application/typescript; charset=utf-8")
		case strings.HasSuffix(r.URL.Path, ".css"):
			h.Set("Content-Type", "text/css; charset=utf-8")
		case strings.HasSuffix(r.URL.Path, ".svg"):
			h.Set("Content-Type", "image/svg+xml")
		}
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(w, r)
	})
}
