package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a program running inside a namespace, started by the harness.
// Its stdout and stderr go to a log file that is printed when the test fails.
// Stopping the test (or killing the test binary) stops the process.
type Process struct {
	Name    string // base name of the program, used in log lines
	NS      string // namespace it runs in
	path    string
	args    []string
	logPath string
	netOnly bool // entered with nsenter --net, keeping the mount namespace

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current run exited
	err  error         // the current run's exit status, once done
}

// StartIn starts path with args inside namespace ns. It fails the test if
// the program cannot be started. The process is stopped, and its log printed
// if the test failed, when t ends.
func StartIn(t testing.TB, ns, path string, args ...string) *Process {
	t.Helper()
	return startIn(t, ns, false, path, args)
}

// StartInNet is StartIn for programs that must share the test process's
// mount namespace, such as a kubelet and its container runtime, each of
// which must see the mounts the other makes: ip netns exec gives the
// program a mount namespace of its own (to mount the namespace's /sys), so
// StartInNet enters only the network namespace, with nsenter --net.
func StartInNet(t testing.TB, ns, path string, args ...string) *Process {
	t.Helper()
	return startIn(t, ns, true, path, args)
}

func startIn(t testing.TB, ns string, netOnly bool, path string, args []string) *Process {
	t.Helper()
	dir := t.TempDir() // before our Cleanup, so the log still exists when it runs
	p := &Process{
		Name:    filepath.Base(path),
		NS:      ns,
		path:    path,
		args:    args,
		logPath: filepath.Join(dir, filepath.Base(path)+".log"),
		netOnly: netOnly,
	}
	if err := p.start(); err != nil {
		t.Fatalf("start %s in %s: %v", p.Name, ns, err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("--- %s in %s: log %s ---\n%s--- end of %s log ---", p.Name, ns, p.logPath, p.Log(), p.Name)
		}
	})
	return p
}

func (p *Process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !isDone(p.done) {
		return fmt.Errorf("%s is already running (pid %d)", p.Name, p.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// ip netns exec and nsenter both exec the program in place, so the pid
	// is the program's.
	argv := append([]string{"ip", "netns", "exec", p.NS, p.path}, p.args...)
	if p.netOnly {
		argv = append([]string{"nsenter", "--net=" + filepath.Join(netnsDir, p.NS), "--", p.path}, p.args...)
	}
	fmt.Fprintf(logf, "=== %s: %s %q\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv[:len(argv)-len(p.args)], " "), p.args)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Pdeathsig fires when the *thread* that forked the child exits. The
	// runtime ends threads whose goroutine exits while locked (as
	// InNamespace's may), so fork from a thread locked for the child's whole
	// life: then the child dies only when the test binary does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	done := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logf.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			close(done)
			return
		}
		started <- nil
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	if err := <-started; err != nil {
		return err
	}
	p.cmd, p.done, p.err = cmd, done, nil
	return nil
}

func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Pid is the current run's process id (0 if it never started).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the current run has not exited.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !isDone(p.done)
}

// Done is closed when the current run exits.
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// ExitErr is the current run's exit status once it exited (nil for status 0).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signal sends sig to the current run.
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || isDone(p.done) {
		return errors.New(p.Name + " is not running")
	}
	return p.cmd.Process.Signal(sig)
}

// Stop ends the current run: SIGTERM, then SIGKILL after 10 s. It returns the
// run's exit error, ignoring the signal we sent; stopping a stopped process
// does nothing.
func (p *Process) Stop() error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if !isDone(done) {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			p.Kill()
			<-done
		}
	}
	err := p.ExitErr()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() &&
			(ws.Signal() == syscall.SIGTERM || ws.Signal() == syscall.SIGKILL) {
			return nil
		}
	}
	return err
}

// Kill sends SIGKILL to the current run's process group and waits for it.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || isDone(done) {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Process.Kill()
	<-done
}

// Start starts the process again after Stop, with the same arguments,
// appending to the same log. It is an error if it is still running.
func (p *Process) Start() error {
	if err := p.start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	return nil
}

// Restart stops the process (SIGTERM) and starts it again with the same
// arguments, appending to the same log.
func (p *Process) Restart() error {
	if err := p.Stop(); err != nil {
		return fmt.Errorf("restart %s: stop: %w", p.Name, err)
	}
	if err := p.start(); err != nil {
		return fmt.Errorf("restart %s: %w", p.Name, err)
	}
	return nil
}

// LogPath is the file the process's stdout and stderr go to.
func (p *Process) LogPath() string { return p.logPath }

// Log returns what the process wrote so far, across restarts.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)\n", err)
	}
	return string(b)
}

// WaitHTTP polls url from inside the process's namespace until ok accepts
// the answer, failing early if the process exits and after timeout.
func (p *Process) WaitHTTP(url string, timeout time.Duration, ok func(code int, body string) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		code, body, err := HTTPGet(p.NS, url, time.Second)
		if err == nil && ok(code, body) {
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("%s exited before GET %s was ok: %v", p.Name, url, p.ExitErr())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET %s in %s not ok after %v: %d %q %v", url, p.NS, timeout, code, body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
