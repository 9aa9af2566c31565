package image

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/test/netns"
)

// dockerInstruction is one instruction of a Dockerfile, continuation lines
// joined: e.g. {"COPY", "--from=build /out/kp /usr/local/bin/kp"}.
type dockerInstruction struct{ cmd, args string }

// finalStage reads the Dockerfile's last stage (after its last FROM): the
// instructions that make the image.
func finalStage(t *testing.T, dockerfile string) []dockerInstruction {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var (
		out  []dockerInstruction
		line string
	)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if cont, ok := strings.CutSuffix(l, "\\"); ok {
			line += cont + " "
			continue
		}
		line += l
		if fields := strings.Fields(line); len(fields) > 0 {
			cmd := strings.ToUpper(fields[0])
			if cmd == "FROM" {
				out = nil
			}
			out = append(out, dockerInstruction{cmd, strings.Join(fields[1:], " ")})
		}
		line = ""
	}
	return out
}

// aptInstalled are the packages a RUN's apt-get install names.
func aptInstalled(run string) []string {
	var pkgs []string
	for _, cmd := range strings.Split(run, "&&") {
		fields := strings.Fields(cmd)
		i := slices.Index(fields, "install")
		if len(fields) == 0 || fields[0] != "apt-get" || i < 0 {
			continue
		}
		for _, f := range fields[i+1:] {
			if !strings.HasPrefix(f, "-") {
				pkgs = append(pkgs, f)
			}
		}
	}
	return pkgs
}

func TestDockerfileAndKPImageAgree(t *testing.T) {
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var (
		entrypoint, cmd []string
		kpDest          string
		links           [][2]string // path, target
		installed       []string
	)
	for _, in := range finalStage(t, filepath.Join(root, "Dockerfile")) {
		switch in.cmd {
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entrypoint); err != nil {
				t.Errorf("ENTRYPOINT %s: not exec form: %v", in.args, err)
			}
		case "CMD":
			if err := json.Unmarshal([]byte(in.args), &cmd); err != nil {
				t.Errorf("CMD %s: not exec form: %v", in.args, err)
			}
		case "COPY":
			if f := strings.Fields(in.args); slices.Contains(f, "/out/kp") {
				kpDest = f[len(f)-1]
			}
		case "RUN":
			installed = append(installed, aptInstalled(in.args)...)
			for _, c := range strings.Split(in.args, "&&") {
				if f := strings.Fields(c); len(f) == 4 && f[0] == "ln" && f[1] == "-s" {
					links = append(links, [2]string{f[3], f[2]})
				}
			}
		}
	}

	img := kpImage(t)
	if !slices.Equal(entrypoint, img.Entrypoint) {
		t.Errorf("ENTRYPOINT: Dockerfile %q, KP %q", entrypoint, img.Entrypoint)
	}
	if !slices.Equal(cmd, img.Cmd) {
		t.Errorf("CMD: Dockerfile %q, KP %q", cmd, img.Cmd)
	}
	files := imageFS(t, img)
	if f, ok := files[kpDest]; kpDest == "" || !ok || f.hdr.Typeflag != tar.TypeReg {
		t.Errorf("the Dockerfile copies kp to %q; KP's image has no file there", kpDest)
	}
	if len(links) == 0 {
		t.Error("the Dockerfile makes no link (kp-top)")
	}
	for _, l := range links {
		if f, ok := files[l[0]]; !ok || f.hdr.Typeflag != tar.TypeSymlink || f.hdr.Linkname != l[1] {
			t.Errorf("the Dockerfile links %s to %s; KP's image does not", l[0], l[1])
		}
	}
	var want []string
	for _, p := range kpPackages {
		if p.Install {
			want = append(want, p.Name)
		}
	}
	slices.Sort(installed)
	slices.Sort(want)
	if !slices.Equal(installed, want) {
		t.Errorf("the Dockerfile installs %q; KP's package list installs %q", installed, want)
	}
}

func TestDaemonSetCommandIsAnExecutableOfKPImage(t *testing.T) {
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "manifests", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("daemonset.yaml: %v", err)
	}
	files := imageFS(t, kpImage(t))
	for _, c := range ds.Spec.Template.Spec.Containers {
		if len(c.Command) == 0 {
			t.Errorf("container %s: no command; it would run the image's default, kp proxy --help", c.Name)
			continue
		}
		p, err := resolveIn(files, c.Command[0])
		if err != nil {
			t.Errorf("container %s runs %s: %v", c.Name, c.Command[0], err)
		} else if files[p].hdr.Mode&0o111 == 0 {
			t.Errorf("container %s runs %s: not executable", c.Name, c.Command[0])
		}
	}
}
