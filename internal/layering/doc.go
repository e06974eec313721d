// Package layering holds no code: its test pins which packages may link a
// Redis or PostgreSQL driver. The model (snapshot), the hub and the
// transports (sse, ws) must not, so they stay testable and reusable without
// servers; a refactor that drags a driver back in fails the test instead of
// going unnoticed.
package layering
