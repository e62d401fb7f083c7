// Command authorityctl inspects and operates the etcd-backed authority store:
// rows, owner leases, capacity, terminals, aggregates and reservations, plus
// a doctor for the etcd cluster and a self-contained demo.
//
// Its commands only read, and write nothing even when they open the store,
// except those annotated as writing (annotationWrites), which `authorityctl
// --help` lists with what they write: the operator writes behind --yes (with
// --dry-run to show what they would do) and the commands that bring their
// own namespace or server (bench, demo).
//
// Exit codes:
//
//	0  success
//	1  the command failed (a missing row, a failed doctor check, a store error)
//	2  usage error (bad flag, bad argument, unknown kind or command)
//	3  cannot connect (endpoint unreachable within --dial-timeout, TLS files,
//	   credentials)
//	130  stopped by Ctrl-C or SIGTERM (every command, also watch, top and
//	     demo --serve, which run until stopped)
package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// Exit codes (see the package comment).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitConnect = 3
	// exitInterrupted is 128 + SIGINT, what a shell reports for a process
	// that Ctrl-C ended.
	exitInterrupted = 130
)

// exitError is an error with the exit code it maps to.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageError(err error) error   { return &exitError{code: exitUsage, err: err} }
func connectError(err error) error { return &exitError{code: exitConnect, err: err} }

func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return exitFailure
}
