package redisx

import (
	"context"
	"errors"
	"net"

	"github.com/redis/go-redis/v9"
)

// The classifiers below read errors the way go-redis reports them: an error
// reply of Redis is a value implementing redis.Error (wrapped or not) whose
// text is the reply's, "ERR " included; a failed connection or a timeout is
// not one.

// IsReply reports whether err is an error reply of Redis to one command, as
// opposed to a failed connection, a timeout or a canceled context: the
// connection that carried it still works.
func IsReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// IsNoSuchKey reports whether err is Redis's "ERR no such key", the reply of
// XINFO STREAM (among others) about a key that does not exist. go-redis's
// HasErrorPrefix matches the reply's text after "ERR ".
func IsNoSuchKey(err error) bool { return redis.HasErrorPrefix(err, "no such key") }

// IsNoScript reports whether err is Redis's NOSCRIPT reply to an EVALSHA of
// a script it does not have cached.
func IsNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// IsMoved reports whether err is a cluster's MOVED reply: the key's slot is
// served by another master. go-redis parses MOVED replies into a typed error
// that redis.IsMovedError recognises, wrapped or not.
func IsMoved(err error) bool {
	_, ok := redis.IsMovedError(err)
	return ok
}

// IsTimeout reports whether err is a timeout of a read or write on the
// connection, such as PubSub.ReceiveTimeout's when nothing arrived in time.
// go-redis returns the socket's net.Error for it and, for a receive with a
// timeout, keeps the connection.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
