// Package web serves what pushd gives browsers besides the protocol: the
// JavaScript client at /client/ and the demo page with its task simulator
// at /demo/, both embedded in the binary.
package web

import (
	"crypto/sha256"
	"embed"
	"encoding/base64"
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
// talks to, whatever its own origin. A module script from another origin is
// fetched with CORS, and the client is public code that carries nothing
// of anyone's: every origin may load it.
func Client() http.Handler {
	return static(sub("client"), true)
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
// Each has an ETag of its content, so the revalidation of an unchanged file
// is a 304. anyOrigin lets pages of every origin read them.
func static(f fs.FS, anyOrigin bool) http.Handler {
	files := http.FileServerFS(f)
	etags := etagsOf(f)
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
		h.Set("ETag", etags[name])
		if anyOrigin {
			h.Set("Access-Control-Allow-Origin", "*")
			// A page that isolates itself (Cross-Origin-Embedder-Policy)
			// loads only what says it may be embedded anywhere.
			h.Set("Cross-Origin-Resource-Policy", "cross-origin")
		}
		files.ServeHTTP(w, r) // answers If-None-Match against the ETag
	})
}

// etagsOf is a strong ETag of every file of f, by name: a digest of its
// content, computed once.
func etagsOf(f fs.FS) map[string]string {
	etags := map[string]string{}
	err := fs.WalkDir(f, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(f, name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		etags[name] = `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`
		return nil
	})
	if err != nil {
		panic(err) // the files are embedded; only a broken build gets here
	}
	return etags
}
