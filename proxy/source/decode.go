package source

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// ManifestError reports why one document of one manifest file was rejected.
// Document is 1-based and counts the non-empty documents of the file; it is 0
// for errors about the whole file (it cannot be read, say).
type ManifestError struct {
	File     string
	Document int
	Err      error
}

func (e *ManifestError) Error() string {
	if e.Document == 0 {
		return fmt.Sprintf("%s: %v", e.File, e.Err)
	}
	return fmt.Sprintf("%s: document %d: %v", e.File, e.Document, e.Err)
}

func (e *ManifestError) Unwrap() error { return e.Err }

// objectKey names one object a manifest folder defines. Namespace is empty for
// Nodes and ServiceCIDRs, which are cluster-scoped.
type objectKey struct {
	Kind      string
	Namespace string
	Name      string
}

func (k objectKey) String() string {
	if k.Namespace == "" {
		return k.Kind + " " + k.Name
	}
	return k.Kind + " " + k.Namespace + "/" + k.Name
}

// manifestObject is one decoded object with the document it came from.
type manifestObject struct {
	key      objectKey
	obj      runtime.Object // *v1.Service, *discovery.EndpointSlice, *v1.Node or *networkingv1.ServiceCIDR
	document int
}

// wantAPIVersion is the apiVersion kp reads for each kind it uses; every
// other kind in a manifest folder is skipped with a warning.
var wantAPIVersion = map[string]string{
	"Service":       "v1",
	"Node":          "v1",
	"EndpointSlice": discovery.SchemeGroupVersion.String(),
	"ServiceCIDR":   networkingv1.SchemeGroupVersion.String(),
}

// clusterScoped are the kinds without a namespace.
var clusterScoped = map[string]bool{"Node": true, "ServiceCIDR": true}

// manifestDecoder turns manifest files into API objects with the API
// machinery's strict decoder, so unknown and duplicate fields are errors
// rather than silently dropped settings.
type manifestDecoder struct {
	decoder runtime.Decoder
}

func newManifestDecoder() *manifestDecoder {
	scheme := runtime.NewScheme()
	// AddToScheme only fails on conflicting registrations, which two
	// fresh built-in groups cannot have.
	if err := v1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := discovery.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := networkingv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	codecs := serializer.NewCodecFactory(scheme, serializer.EnableStrict)
	return &manifestDecoder{decoder: codecs.UniversalDeserializer()}
}

// decodeFile decodes every document of one file. It returns the objects, the
// documents it skipped on purpose (other kinds, as warnings) and the errors;
// a caller must not use objs when errs is not empty. file is only used to
// name the file in errors.
func (m *manifestDecoder) decodeFile(file string, data []byte) (objs []manifestObject, warnings, errs []error) {
	// The YAML reader hands documents back line by line with "\n" endings;
	// normalising first lets documentLines find each one in data.
	data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	seen := make(map[objectKey]int)
	doc, offset := 0, 0
	for {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// A malformed separator line ("--- foo") ends the file.
			errs = append(errs, &ManifestError{File: file, Document: doc + 1, Err: err})
			break
		}
		var firstLine int
		firstLine, offset = documentLines(data, raw, offset)
		j, err := yaml.YAMLToJSON(raw)
		if err != nil {
			errs = append(errs, &ManifestError{File: file, Document: doc + 1, Err: yamlError(err, firstLine)})
			doc++
			continue
		}
		if isEmptyDocument(j) {
			continue // comments only, or an empty document between separators
		}
		doc++
		fail := func(err error) { errs = append(errs, &ManifestError{File: file, Document: doc, Err: err}) }
		decoded, skipped, err := m.decodeDocument(raw, j, firstLine, false)
		if err != nil {
			fail(err)
			continue
		}
		for _, s := range skipped {
			warnings = append(warnings, &ManifestError{File: file, Document: doc, Err: s})
		}
		for _, o := range decoded {
			if prev, dup := seen[o.key]; dup {
				fail(fmt.Errorf("%s is defined twice in this file (first in document %d)", o.key, prev))
				continue
			}
			seen[o.key] = doc
			o.document = doc
			objs = append(objs, o)
		}
	}
	return objs, warnings, errs
}

// decodeDocument decodes one document: raw is its original text (YAML or
// JSON) and j the same as JSON. A v1 List yields its items (inList: this is
// one, and Lists do not nest).
func (m *manifestDecoder) decodeDocument(raw, j []byte, firstLine int, inList bool) (objs []manifestObject, skipped []error, err error) {
	var head struct {
		APIVersion *string `json:"apiVersion"`
		Kind       *string `json:"kind"`
	}
	if err := json.Unmarshal(j, &head); err != nil {
		var fields map[string]json.RawMessage
		if json.Unmarshal(j, &fields) != nil {
			return nil, nil, errors.New("not an object: want a Kubernetes object with apiVersion and kind")
		}
		return nil, nil, errors.New("apiVersion and kind must be strings")
	}
	kind, apiVersion := deref(head.Kind), deref(head.APIVersion)
	switch {
	case kind == "" && apiVersion == "":
		return nil, nil, errors.New("apiVersion, kind: required")
	case kind == "":
		return nil, nil, errors.New("kind: required")
	case apiVersion == "":
		return nil, nil, fmt.Errorf("%s.apiVersion: required", kind)
	}

	if kind == "List" && apiVersion == "v1" && !inList {
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(j, &list); err != nil {
			return nil, nil, fmt.Errorf("List.items: %w", err)
		}
		for i, item := range list.Items {
			o, s, err := m.decodeDocument(item, item, 0, true)
			if err != nil {
				return nil, nil, fmt.Errorf("items[%d]: %w", i, err)
			}
			objs = append(objs, o...)
			for _, e := range s {
				skipped = append(skipped, fmt.Errorf("items[%d]: %w", i, e))
			}
		}
		return objs, skipped, nil
	}

	want, known := wantAPIVersion[kind]
	if !known {
		return nil, []error{fmt.Errorf("skipped %s %s: kp reads only Service (v1), EndpointSlice (discovery.k8s.io/v1), Node (v1) and ServiceCIDR (networking.k8s.io/v1)", apiVersion, kind)}, nil
	}
	if apiVersion != want {
		return nil, nil, fmt.Errorf("%s.apiVersion: %q is not supported, use %q", kind, apiVersion, want)
	}

	// The original text goes to the decoder so that its YAML path can
	// report duplicate keys, which the JSON conversion would drop.
	obj, _, err := m.decoder.Decode(raw, nil, nil)
	if err != nil {
		return nil, nil, decodeError(err, kind, firstLine)
	}
	meta, ok := obj.(metav1.Object)
	if !ok {
		return nil, nil, fmt.Errorf("%s: decoded into unexpected type %T", kind, obj)
	}
	if meta.GetName() == "" {
		return nil, nil, fmt.Errorf("%s.metadata.name: required", kind)
	}
	key := objectKey{Kind: kind, Name: meta.GetName()}
	if clusterScoped[kind] {
		meta.SetNamespace("") // cluster-scoped: a namespace there means nothing
	} else {
		if meta.GetNamespace() == "" {
			meta.SetNamespace(metav1.NamespaceDefault)
		}
		key.Namespace = meta.GetNamespace()
	}
	return []manifestObject{{key: key, obj: obj}}, nil, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func isEmptyDocument(j []byte) bool {
	j = bytes.TrimSpace(j)
	return len(j) == 0 || bytes.Equal(j, []byte("null"))
}

// documentLines finds raw, a document the YAML reader returned, in data at or
// after offset. It returns the document's first line (1-based; 0 if it cannot
// be found) and the offset just past it.
func documentLines(data, raw []byte, offset int) (firstLine, next int) {
	// The reader adds a final "\n" to a file that lacks one.
	needle := bytes.TrimRight(raw, "\n")
	for from := offset; from <= len(data); {
		i := bytes.Index(data[from:], needle)
		if i < 0 {
			break
		}
		at := from + i
		// Documents start at a line start; a match inside a separator
		// line ("--- # web") is not the document.
		if at == 0 || data[at-1] == '\n' {
			return bytes.Count(data[:at], []byte("\n")) + 1, at + len(needle)
		}
		from = at + 1
	}
	return 0, offset
}

var (
	yamlLineRE = regexp.MustCompile(`line (\d+)`)
	// "json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32"
	jsonTypeRE = regexp.MustCompile(`^json: cannot unmarshal (.+) into Go (?:struct field \S+?\.(\S+)|value) of type (\S+)$`)
)

// yamlError rewrites the document-relative line numbers of a YAML parser
// message into lines of the file, which is what an editor shows.
func yamlError(err error, firstLine int) error {
	msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
	msg = strings.TrimPrefix(msg, "yaml: ")
	if firstLine > 0 {
		msg = yamlLineRE.ReplaceAllStringFunc(msg, func(m string) string {
			n, _ := strconv.Atoi(strings.TrimPrefix(m, "line "))
			return "line " + strconv.Itoa(n+firstLine-1)
		})
	}
	// Multi-line messages ("unmarshal errors:\n  line 5: ...") go on one line.
	msg = strings.TrimPrefix(msg, "unmarshal errors:")
	var parts []string
	for _, line := range strings.Split(msg, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			parts = append(parts, line)
		}
	}
	return fmt.Errorf("invalid YAML: %s", strings.Join(parts, "; "))
}

// decodeError turns a decoder error into "<Kind>.<field path>: <reason>"
// where the decoder names the field, keeping the decoder's own text otherwise.
func decodeError(err error, kind string, firstLine int) error {
	if strictErr, ok := runtime.AsStrictDecodingError(err); ok {
		var msgs []string
		for _, e := range strictErr.Errors() {
			var fe interface{ FieldPath() string }
			if errors.As(e, &fe) {
				reason := strings.TrimSuffix(e.Error(), " "+strconv.Quote(fe.FieldPath()))
				msgs = append(msgs, fmt.Sprintf("%s.%s: %s", kind, fe.FieldPath(), reason))
				continue
			}
			// Duplicate YAML keys come as a YAML error with lines.
			msgs = append(msgs, fmt.Sprintf("%s: %v", kind, yamlError(e, firstLine)))
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	if m := jsonTypeRE.FindStringSubmatch(err.Error()); m != nil {
		field := kind
		if m[2] != "" {
			field += "." + m[2]
		}
		return fmt.Errorf("%s: got %s, want %s", field, m[1], m[3])
	}
	return fmt.Errorf("%s: %w", kind, err)
}

// DecodeManifest decodes one manifest file's content exactly as the folder
// source does (strict decoding, multi-document YAML or JSON, v1 Lists) and
// returns the Services, EndpointSlices, Nodes and ServiceCIDRs it defines,
// in document order. Kinds kp does not read are skipped; any error rejects
// the whole file, as the folder source does. It is the entry point of the
// fuzz tests that follow decoded objects into a backend.
func DecodeManifest(data []byte) ([]runtime.Object, error) {
	objs, _, errs := newManifestDecoder().decodeFile("manifest", data)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	out := make([]runtime.Object, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.obj)
	}
	return out, nil
}
