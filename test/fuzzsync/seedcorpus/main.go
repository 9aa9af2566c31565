// Command seedcorpus writes the committed seed corpus of kp's fuzz targets
// (testdata/fuzz/<FuzzName>/ in each package, Go's corpus format), so a
// plain `go test` replays every seed. Run from the repository's root:
//
//	go run ./test/fuzzsync/seedcorpus
//
// The manifest targets get the demo's manifests, nft's testdata/manifests
// and the edge cases below; the config file, migration request, services
// query and Node annotation targets get theirs. Inputs the fuzzer finds
// failing are written beside them by `go test -fuzz`, and stay when
// committed.
package main

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// manifestTargets are the fuzz targets fed manifest bytes, by package.
var manifestTargets = map[string]string{
	"nft":              "FuzzManifestToNFT",
	"legacy/iptables":  "FuzzManifestToIPTables",
	"legacy/ipvs":      "FuzzManifestToIPVS",
	"legacy/userspace": "FuzzManifestToUserspace",
}

func main() {
	manifests := map[string]string{}
	for _, g := range []string{"manifests/demo/*.yaml", "nft/testdata/manifests/*.yaml"} {
		paths, err := filepath.Glob(g)
		if err != nil || len(paths) == 0 {
			log.Fatalf("%s: no files (%v); run from the repository's root", g, err)
		}
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				log.Fatal(err)
			}
			name := strings.NewReplacer("/", "-", ".yaml", "").Replace(filepath.Dir(p)[strings.LastIndex(filepath.Dir(p), "/")+1:] + "-" + filepath.Base(p))
			manifests[name] = string(data)
		}
	}
	for name, m := range edgeManifests {
		manifests["edge-"+name] = m
	}
	for pkg, target := range manifestTargets {
		for name, m := range manifests {
			write(pkg, target, name, bytesLine(m))
		}
	}
	for name, c := range configFiles {
		write("cmd/kp/options", "FuzzConfigFile", name, bytesLine(c))
	}
	for name, r := range migrationRequests {
		write("proxy/server", "FuzzMigrationRequest", name, bytesLine(r[0])+"\n"+"string("+strconv.Quote(r[1])+")")
	}
	for name, q := range servicesQueries {
		write("proxy/server", "FuzzServicesQuery", name, "string("+strconv.Quote(q)+")")
	}
	for name, a := range nodeAnnotations {
		write("migrate", "FuzzNodeAnnotations", name, fmt.Sprintf("string(%s)\nbool(%t)\nbool(%t)\nstring(%s)",
			strconv.Quote(a.mode), a.allowNone, a.atStart, strconv.Quote(a.record)))
	}
}

func bytesLine(s string) string { return "[]byte(" + strconv.Quote(s) + ")" }

func write(pkg, target, name, values string) {
	dir := filepath.Join(pkg, "testdata", "fuzz", target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	body := fmt.Sprintf("go test fuzz v1\n%s\n", values)
	if err := os.WriteFile(filepath.Join(dir, "seed-"+name), []byte(body), 0o644); err != nil {
		log.Fatal(err)
	}
}
