package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// kp's exit codes: one per kind of outcome, so that a script or a CI job
// tells a command that failed from one given wrongly and from one a check
// refused, without reading the message.
const (
	exitFailed  = 1 // what was asked went wrong
	exitUsage   = 2 // the command line is wrong: nothing was done
	exitRefused = 3 // a check refused what was asked: nothing was changed
)

// exitCodesHelp ends every command's --help.
const exitCodesHelp = `
Exit status:
  0  done.
  1  failed: what was asked went wrong (kp proxy and kp sysctl: any error,
     their settings' included, as kube-proxy).
  2  bad usage: an unknown command or flag, a flag value or a combination of
     flags the command refuses, a missing required flag, extra arguments.
     Nothing was done.
  3  refused: a check refused what was asked, and nothing was changed: the
     preflight of kp migrate cluster --from-kube-proxy --dry-run found errors,
     or the kp proxy on the node refused the switch kp migrate node asked for
     (another switch under way, or one kp does not make).
`

// usageError is a command line the command refuses before doing anything.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// usage marks err, when there is one, as bad usage.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// refusedError is a request a check refused, changing nothing.
type refusedError struct{ err error }

func (e refusedError) Error() string { return e.err.Error() }
func (e refusedError) Unwrap() error { return e.err }

// refusedSwitch marks err as refused when the kp proxy answered the switch
// request with 409 Conflict: it refused it, and nothing changed.
func refusedSwitch(err error) error {
	var he *statusapi.HTTPError
	if errors.As(err, &he) && he.Code == http.StatusConflict {
		return refusedError{err}
	}
	return err
}

// exitCode is the exit code for err, the error a command line ended with;
// started says whether the command itself ran: an error before that
// (cobra's own: an unknown command or flag, a bad flag value, arguments,
// a required flag) is bad usage.
func exitCode(err error, started bool) int {
	var u usageError
	var r refusedError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &r):
		return exitRefused
	case errors.As(err, &u), !started:
		return exitUsage
	}
	return exitFailed
}

// noteStarts wraps every command's RunE under c so that *started is set
// when one runs: whatever fails before, cobra refused the command line.
func noteStarts(c *cobra.Command, started *bool) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			*started = true
			return run(cmd, args)
		}
	}
	if run := c.Run; run != nil {
		c.Run = func(cmd *cobra.Command, args []string) {
			*started = true
			run(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		noteStarts(sub, started)
	}
}

func refusedErrorf(format string, args ...any) error {
	return refusedError{fmt.Errorf(format, args...)}
}

// jsonResult ends a command's JSON Lines (-o json) with its outcome:
// {"type":"result","exitCode":N,"error":"..."}, the exit code kp exits
// with.
func (a *app) jsonResult(err error) {
	r := struct {
		Type     string `json:"type"`
		ExitCode int    `json:"exitCode"`
		Error    string `json:"error,omitempty"`
	}{Type: "result", ExitCode: exitCode(err, true)}
	if err != nil {
		r.Error = err.Error()
	}
	b, _ := json.Marshal(r)
	fmt.Fprintln(a.stdout, string(b))
}
