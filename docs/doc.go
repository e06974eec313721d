// Package docs holds pushd's documentation. Its tests check that the
// documents refer only to the repository itself: every relative link
// resolves to a file of the repository (and every anchor to a heading),
// nothing links to the web, and every mention of the design document, in
// the documents and in the code, names a section it has.
package docs
