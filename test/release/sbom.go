package release

import (
	"bytes"
	"crypto/sha1"
	"fmt"
	"net/url"
	"runtime/debug"
	"slices"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"

	"github.com/kpproxy/kp/test/image"
)

// sbomSpec is the CycloneDX version the SBOMs are written in: 1.6, which
// the common scanners read (1.7 is newer than some).
const sbomSpec = cdx.SpecVersion1_6

// serialNumber is a BOM's serial number derived from what it describes
// (a UUID of version 5, named by the artifact's SHA-256): the same
// artifact gets the same BOM, byte for byte, where a random serial would
// make every release differ.
func serialNumber(sha256Hex string) string {
	// RFC 9562's URL namespace.
	ns := []byte{0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8}
	h := sha1.Sum(append(ns, "https://github.com/kpproxy/kp/releases#sha256:"+sha256Hex...))
	u := h[:16]
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// goPURL is the package URL of a Go module.
func goPURL(path, version string, qualifiers ...string) string {
	p := "pkg:golang/" + path + "@" + url.PathEscape(version) + "?type=module"
	for i := 0; i+1 < len(qualifiers); i += 2 {
		p += "&" + qualifiers[i] + "=" + url.QueryEscape(qualifiers[i+1])
	}
	return p
}

// debPURL is the package URL of a Debian 12 package.
func debPURL(p image.DebPackage) string {
	return "pkg:deb/debian/" + p.Name + "@" + url.PathEscape(p.Version) + "?arch=" + p.Arch + "&distro=debian-12"
}

func sha256Hash(hex string) *[]cdx.Hash {
	return &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: hex}}
}

// tool is what made the BOMs.
func tool(r *Release) *cdx.ToolsChoice {
	return &cdx.ToolsChoice{Components: &[]cdx.Component{{
		Type: cdx.ComponentTypeApplication, Name: "kp-release", Version: r.Version,
		Description: "kp's make release (test/release)",
	}}}
}

// binaryComponent describes a kp binary: its module as released, the file's
// hash, and how it was built (from its build information).
func binaryComponent(r *Release, b binary, info *debug.BuildInfo, ref string) cdx.Component {
	var props []cdx.Property
	for _, s := range info.Settings {
		props = append(props, cdx.Property{Name: "kp:go:build:" + s.Key, Value: s.Value})
	}
	props = append(props, cdx.Property{Name: "kp:go:version", Value: info.GoVersion})
	return cdx.Component{
		BOMRef: ref, Type: cdx.ComponentTypeApplication,
		Name: "kp", Version: r.Version, Description: "kp, a Kubernetes node proxy, for linux/" + b.arch,
		Hashes:     sha256Hash(b.sha256),
		PackageURL: goPURL(info.Main.Path, r.Version, "goos", "linux", "goarch", b.arch),
		Properties: &props,
		ExternalReferences: &[]cdx.ExternalReference{
			{Type: cdx.ERTypeVCS, URL: "https://github.com/kpproxy/kp", Comment: "commit " + r.Commit},
		},
	}
}

// binarySBOM is the bill of materials of a kp binary, from the build
// information Go embeds in it (debug/buildinfo): the Go toolchain's
// standard library and every module linked, at the version and go.sum hash
// the build used.
func binarySBOM(r *Release, b binary, info *debug.BuildInfo) ([]byte, error) {
	root := binaryComponent(r, b, info, "kp")
	components := []cdx.Component{{
		BOMRef: "std", Type: cdx.ComponentTypeLibrary, Name: "std", Version: info.GoVersion,
		Description: "the Go standard library", PackageURL: goPURL("std", info.GoVersion),
	}}
	deps := []string{"std"}
	for _, m := range info.Deps {
		c := cdx.Component{Type: cdx.ComponentTypeLibrary, Name: m.Path, Version: m.Version}
		sum := m.Sum
		if m.Replace != nil {
			// What is linked is the replacement.
			c.Version, sum = m.Replace.Version, m.Replace.Sum
			c.Properties = &[]cdx.Property{{Name: "kp:go:replaced-by", Value: m.Replace.Path + "@" + m.Replace.Version}}
			c.PackageURL = goPURL(m.Replace.Path, m.Replace.Version)
		} else {
			c.PackageURL = goPURL(m.Path, m.Version)
		}
		if sum != "" {
			props := append(derefProps(c.Properties), cdx.Property{Name: "kp:go:sum", Value: sum})
			c.Properties = &props
		}
		c.BOMRef = c.PackageURL
		components = append(components, c)
		deps = append(deps, c.BOMRef)
	}
	bom := cdx.NewBOM()
	bom.SerialNumber = serialNumber(b.sha256)
	bom.Metadata = &cdx.Metadata{Timestamp: r.Date, Tools: tool(r), Component: &root}
	bom.Components = &components
	bom.Dependencies = &[]cdx.Dependency{{Ref: root.BOMRef, Dependencies: &deps}}
	return encodeBOM(bom)
}

func derefProps(p *[]cdx.Property) []cdx.Property {
	if p == nil {
		return nil
	}
	return *p
}

// imageSBOM is the bill of materials of the image index: per platform, its
// image with the Debian packages its files come from and the kp binary
// (whose own modules are in that binary's SBOM, referenced).
func imageSBOM(r *Release, idx image.WrittenIndex, imgs []platformImage, sha256Hex string) ([]byte, error) {
	repo := r.ImageRepo
	name := repo[strings.LastIndex(repo, "/")+1:]
	root := cdx.Component{
		BOMRef: "image-index", Type: cdx.ComponentTypeContainer,
		Name: repo, Version: r.Version,
		Description: "kp's container image, an OCI image index of linux/amd64 and linux/arm64",
		Hashes:      sha256Hash(idx.Digest.Hex),
		PackageURL:  "pkg:oci/" + name + "@" + url.PathEscape(idx.Digest.String()) + "?repository_url=" + url.QueryEscape(repo),
	}
	var components []cdx.Component
	var deps []cdx.Dependency
	var platforms []string
	for _, pi := range imgs {
		ref := "linux/" + pi.arch
		manifest := idx.Manifests[pi.arch]
		var children []cdx.Component
		var childRefs []string
		for _, p := range pi.img.Packages {
			c := cdx.Component{
				BOMRef: ref + ":" + debPURL(p), Type: cdx.ComponentTypeLibrary,
				Name: p.Name, Version: p.Version, Hashes: sha256Hash(p.SHA256), PackageURL: debPURL(p),
				Supplier: &cdx.OrganizationalEntity{Name: "Debian"},
			}
			children = append(children, c)
			childRefs = append(childRefs, c.BOMRef)
		}
		kp := binaryComponent(r, pi.bin, pi.info, ref+":kp")
		refs := append(*kp.ExternalReferences, cdx.ExternalReference{Type: cdx.ERTypeBOM, URL: pi.bin.name + ".cdx.json",
			Comment: "the modules linked into this binary"})
		kp.ExternalReferences = &refs
		children = append(children, kp)
		childRefs = append(childRefs, kp.BOMRef)
		components = append(components, cdx.Component{
			BOMRef: ref, Type: cdx.ComponentTypeContainer, Name: repo, Version: r.Version,
			Description: "kp's image for " + ref,
			Hashes:      sha256Hash(manifest.Hex),
			PackageURL:  "pkg:oci/" + name + "@" + url.PathEscape(manifest.String()) + "?arch=" + pi.arch + "&repository_url=" + url.QueryEscape(repo),
			Properties:  &[]cdx.Property{{Name: "kp:oci:platform", Value: ref}},
			Components:  &children,
		})
		deps = append(deps, cdx.Dependency{Ref: ref, Dependencies: &childRefs})
		platforms = append(platforms, ref)
	}
	slices.Sort(platforms)
	deps = append([]cdx.Dependency{{Ref: root.BOMRef, Dependencies: &platforms}}, deps...)
	bom := cdx.NewBOM()
	bom.SerialNumber = serialNumber(sha256Hex)
	bom.Metadata = &cdx.Metadata{Timestamp: r.Date, Tools: tool(r), Component: &root}
	bom.Components = &components
	bom.Dependencies = &deps
	return encodeBOM(bom)
}

func encodeBOM(bom *cdx.BOM) ([]byte, error) {
	var buf bytes.Buffer
	enc := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	enc.SetEscapeHTML(false)
	if err := enc.EncodeVersion(bom, sbomSpec); err != nil {
		return nil, fmt.Errorf("sbom: %w", err)
	}
	return buf.Bytes(), nil
}
