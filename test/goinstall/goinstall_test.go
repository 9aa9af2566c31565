package goinstall

import (
	"archive/zip"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

const module = "github.com/kpproxy/kp"

func TestGoInstallBuildsKpFromAModuleProxy(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		netns.Unavailable(t, "skipped: no go command on PATH: %v", err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		netns.Unavailable(t, "skipped: no git on PATH (the module's files are the checkout's tracked files): %v", err)
	}
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	modcache := goEnv(t, gobin, "GOMODCACHE")

	dir := t.TempDir()
	version := pseudoVersion(t, root)
	proxyDir := filepath.Join(dir, "proxy")
	serveModule(t, root, proxyDir, version)

	gopath := filepath.Join(dir, "gopath")
	bin := filepath.Join(dir, "bin")
	// The install's own GOPATH and module cache; the build cache stays the
	// user's, as it would be for a real go install (and keeps this under a
	// minute when the dependencies were built before, -trimpath as make
	// build). GOSUMDB=off: the checksum database is on the network; the
	// dependencies come from the module cache, which verified them when
	// it downloaded them. -modcacherw lets the test remove the cache.
	env := append(withoutGoEnv(os.Environ()),
		"GOPATH="+gopath,
		"GOMODCACHE="+filepath.Join(gopath, "pkg", "mod"),
		"GOBIN="+bin,
		"GOPROXY="+fileURL(proxyDir)+","+fileURL(filepath.Join(modcache, "cache", "download")),
		"GOSUMDB=off",
		"GOTOOLCHAIN=local",
		"GOFLAGS=-modcacherw",
		"CGO_ENABLED=0",
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	target := module + "/cmd/kp@" + version
	start := time.Now()
	install := exec.CommandContext(ctx, gobin, "install", "-trimpath", target)
	install.Dir = dir // outside any module
	install.Env = env
	out, err := install.CombinedOutput()
	if err != nil {
		t.Fatalf("go install %s: %v\n%s\n(dependencies come from %s: run `go mod download` in the repository first if one is missing there)",
			target, err, dropDownloading(out), modcache)
	}
	t.Logf("go install %s: %v", target, time.Since(start).Round(100*time.Millisecond))

	kp := filepath.Join(bin, "kp")
	got, err := exec.Command(kp, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", kp, err, got)
	}
	rev := version[strings.LastIndexByte(version, '-')+1:]
	for _, want := range []string{"kp version " + version + "\n", "git commit: " + rev + "\n"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("the installed kp's `kp version` lacks %q:\n%s", want, got)
		}
	}
	// What Go recorded: this module at this version, nothing replaced.
	info, err := exec.Command(gobin, "version", "-m", kp).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m %s: %v\n%s", kp, err, info)
	}
	if !strings.Contains(string(info), "\tmod\t"+module+"\t"+version) {
		t.Errorf("go version -m: the installed kp is not %s %s:\n%s", module, version, info)
	}
	if strings.Contains(string(info), "=>") {
		t.Errorf("go version -m: the installed kp was built with a replaced module:\n%s", info)
	}
}

// pseudoVersion names the checkout's commit as the go command names an
// untagged one: v0.0.0-<commit time, UTC>-<12 hex digits>. The module
// served is the working tree, so a change not yet committed is tested too.
func pseudoVersion(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%H %ct").Output()
	if err != nil {
		netns.Unavailable(t, "skipped: %s is not a git checkout: %v", root, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) != 2 || len(fields[0]) < 12 {
		t.Fatalf("git log -1: %q", out)
	}
	sec, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		t.Fatalf("git log -1: commit time %q: %v", fields[1], err)
	}
	return "v0.0.0-" + time.Unix(sec, 0).UTC().Format("20060102150405") + "-" + fields[0][:12]
}

// serveModule writes the module proxy layout for module@version into dir:
// the version list, its .info, its go.mod and its zip of the checkout's
// tracked files as they are in the working tree, less nested modules (as
// the go command leaves them out of a module's zip).
func serveModule(t *testing.T, root, dir, version string) {
	t.Helper()
	at := filepath.Join(dir, filepath.FromSlash(module), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	var nested []string
	for _, f := range files {
		if path.Base(f) == "go.mod" && f != "go.mod" {
			nested = append(nested, path.Dir(f)+"/")
		}
	}

	zf, err := os.Create(filepath.Join(at, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer zf.Close()
	zw := zip.NewWriter(zf)
	n := 0
	for _, f := range files {
		if inAny(f, nested) {
			continue
		}
		src, err := os.Open(filepath.Join(root, filepath.FromSlash(f)))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		w, err := zw.Create(module + "@" + version + "/" + f)
		if err == nil {
			_, err = io.Copy(w, src)
		}
		src.Close()
		if err != nil {
			t.Fatalf("zip %s: %v", f, err)
		}
		n++
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("the module's zip holds %d files; git ls-files listed %d", n, len(files))
	}

	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := json.Marshal(struct{ Version, Time string }{version, time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		version + ".mod":  gomod,
		version + ".info": info,
		"list":            []byte(version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func inAny(file string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(file, d) {
			return true
		}
	}
	return false
}

func goEnv(t *testing.T, gobin, name string) string {
	t.Helper()
	out, err := exec.Command(gobin, "env", name).Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env %s: %q %v", name, out, err)
	}
	return strings.TrimSpace(string(out))
}

// withoutGoEnv drops the variables the test sets, and GOWORK and GOFLAGS,
// which a developer's shell may hold.
func withoutGoEnv(env []string) []string {
	var kept []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "GOPATH", "GOMODCACHE", "GOBIN", "GOPROXY", "GONOPROXY", "GOPRIVATE", "GONOSUMDB", "GOSUMDB",
			"GOTOOLCHAIN", "GOFLAGS", "GOWORK", "CGO_ENABLED", "GOINSECURE":
			continue
		}
		kept = append(kept, kv)
	}
	return kept
}

func fileURL(dir string) string { return "file://" + filepath.ToSlash(dir) }

// dropDownloading leaves out the go command's "go: downloading" lines, one
// per dependency, so that its error shows.
func dropDownloading(out []byte) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(string(out), "\n") {
		if !strings.HasPrefix(line, "go: downloading ") {
			b.WriteString(line)
		}
	}
	return b.String()
}
