package options

import (
	"encoding"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	upstream "k8s.io/kube-proxy/config/v1alpha1"
	kjson "sigs.k8s.io/json"
)

// The kp binary must not link upstream's package (see kubeproxyconfig.go and
// cmd/kp/deps_test.go); its tests may, to hold the mirror to it.

func TestKubeProxyConfigurationMirrorsUpstreamFields(t *testing.T) {
	want := jsonShapes(reflect.TypeFor[upstream.KubeProxyConfiguration]())
	got := jsonShapes(reflect.TypeFor[KubeProxyConfiguration]())
	paths := map[string]bool{}
	for p := range want {
		paths[p] = true
	}
	for p := range got {
		paths[p] = true
	}
	for _, path := range slices.Sorted(maps.Keys(paths)) {
		w, inUpstream := want[path]
		g, inMirror := got[path]
		switch {
		case !inMirror:
			t.Errorf("mirror lacks %s (upstream: %s)", path, w)
		case !inUpstream:
			t.Errorf("mirror has %s (%s), upstream does not", path, g)
		case w != g:
			t.Errorf("%s: upstream %s, mirror %s", path, w, g)
		}
	}
	if len(want) < 60 {
		t.Errorf("walked only %d paths of upstream's type; the walk is broken", len(want))
	}
}

func TestKubeProxyConfigurationRoundTripsUpstreamObject(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		flushFrequencyAsString bool
	}{
		{"logging.flushFrequency as a duration string", true},
		{"logging.flushFrequency as nanoseconds", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var up upstream.KubeProxyConfiguration
			n := 0
			fillNonZero(t, reflect.ValueOf(&up).Elem(), "", &n)
			up.Logging.FlushFrequency.SerializeAsString = tc.flushFrequencyAsString
			up.TypeMeta = metav1.TypeMeta{APIVersion: configAPIVersion, Kind: configKind}

			in, err := json.Marshal(&up)
			if err != nil {
				t.Fatal(err)
			}
			var mirror KubeProxyConfiguration
			strictErrs, err := kjson.UnmarshalStrict(in, &mirror)
			if err != nil {
				t.Fatalf("decode into the mirror: %v\n%s", err, in)
			}
			for _, e := range strictErrs {
				t.Errorf("decode into the mirror, strictly: %v", e)
			}
			out, err := json.Marshal(&mirror)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != string(in) {
				t.Errorf("the mirror does not marshal back to upstream's JSON\nupstream: %s\nmirror:   %s", in, out)
			}
		})
	}
}

func TestFlushFrequencyDecodesAsUpstream(t *testing.T) {
	for _, in := range []string{`"5s"`, `5000000000`, `0`, `"0s"`, `null`, `1.5`, `"5"`, `true`, `"-3m"`} {
		t.Run(in, func(t *testing.T) {
			js := []byte(`{"flushFrequency":` + in + `}`)
			var up upstream.KubeProxyConfiguration
			var mirror KubeProxyConfiguration
			_, upErr := kjson.UnmarshalStrict(js, &up.Logging)
			_, mirrorErr := kjson.UnmarshalStrict(js, &mirror.Logging)
			if fmt.Sprint(upErr) != fmt.Sprint(mirrorErr) {
				t.Fatalf("error: upstream %v, mirror %v", upErr, mirrorErr)
			}
			upOut, _ := json.Marshal(up.Logging.FlushFrequency)
			mirrorOut, _ := json.Marshal(mirror.Logging.FlushFrequency)
			if string(upOut) != string(mirrorOut) {
				t.Errorf("marshalled back: upstream %s, mirror %s", upOut, mirrorOut)
			}
		})
	}
}

// jsonShapes flattens the JSON form of t into path → shape, following
// encoding/json's rules for names, "-" and embedded structs. A shape names
// the JSON kind (with the Go kind of numbers, since int32 and float32 accept
// different files), pointers (null), the tag's options and the Go field name
// (so two fields swapped in the mirror are caught). A type with its own JSON
// methods is a leaf, named by its type name.
func jsonShapes(t reflect.Type) map[string]string {
	shapes := map[string]string{}
	walkJSON(shapes, "", t)
	return shapes
}

func walkJSON(shapes map[string]string, path string, t reflect.Type) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if hasCustomJSON(t) {
		return
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		walkJSON(shapes, path+"[]", t.Elem())
	case reflect.Map:
		walkJSON(shapes, path+"{}", t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" && opts == "" || !f.IsExported() && !f.Anonymous {
				continue
			}
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if f.Anonymous && name == "" && ft.Kind() == reflect.Struct && !hasCustomJSON(ft) {
				walkJSON(shapes, path, ft) // promoted fields
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			child := name
			if path != "" {
				child = path + "." + name
			}
			shape := jsonShape(f.Type) + " (Go " + f.Name
			if o := tagOptions(opts); o != "" {
				shape += ", " + o
			}
			shapes[child] = shape + ")"
			walkJSON(shapes, child, f.Type)
		}
	}
}

func jsonShape(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		return "null or " + jsonShape(t.Elem())
	}
	if hasCustomJSON(t) {
		if s, ok := customShapes[t.Name()]; ok {
			return s + " (" + t.Name() + ")"
		}
		return "custom JSON of " + t.Name()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "bool"
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return "number (" + t.Kind().String() + ")"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "base64 string"
		}
		return "array of " + jsonShape(t.Elem())
	case reflect.Array:
		return "array of " + jsonShape(t.Elem())
	case reflect.Map:
		return "object of " + jsonShape(t.Key()) + " to " + jsonShape(t.Elem())
	case reflect.Struct:
		return "object"
	case reflect.Interface:
		return "any"
	}
	return "unsupported " + t.Kind().String()
}

// tagOptions are a json tag's options that change the JSON ("inline" is
// Kubernetes' convention, which encoding/json ignores).
func tagOptions(opts string) string {
	var kept []string
	for o := range strings.SplitSeq(opts, ",") {
		if o != "" && o != "inline" {
			kept = append(kept, o)
		}
	}
	return strings.Join(kept, ",")
}

// customShapes are the JSON of the types with their own JSON methods, by
// type name: upstream's TimeOrMetaDuration and the mirror's are two types.
var customShapes = map[string]string{
	"Duration":           "duration string",
	"TimeOrMetaDuration": "duration string or number of nanoseconds",
	"QuantityValue":      "quantity string or number",
}

var (
	jsonMarshaler   = reflect.TypeFor[json.Marshaler]()
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textMarshaler   = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func hasCustomJSON(t reflect.Type) bool {
	for _, i := range []reflect.Type{jsonMarshaler, jsonUnmarshaler, textMarshaler, textUnmarshaler} {
		if t.Implements(i) || reflect.PointerTo(t).Implements(i) {
			return true
		}
	}
	return false
}

// fillNonZero sets every field under v to a distinct non-zero value (n
// counts them), so that a field the mirror drops, or decodes into another
// field, shows in the round trip.
func fillNonZero(t *testing.T, v reflect.Value, path string, n *int) {
	t.Helper()
	*n++
	switch v.Type() {
	case reflect.TypeFor[metav1.Duration]():
		v.Set(reflect.ValueOf(metav1.Duration{Duration: time.Duration(*n) * time.Second}))
		return
	case reflect.TypeFor[resource.QuantityValue]():
		v.Set(reflect.ValueOf(resource.QuantityValue{Quantity: resource.MustParse(fmt.Sprintf("%dMi", *n))}))
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillNonZero(t, v.Elem(), path, n)
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				t.Fatalf("%s.%s: cannot fill an unexported field; teach fillNonZero its type %s", path, f.Name, v.Type())
			}
			fillNonZero(t, v.Field(i), path+"."+f.Name, n)
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillNonZero(t, v.Index(0), path+"[0]", n)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k := reflect.New(v.Type().Key()).Elem()
		fillNonZero(t, k, path+"{key}", n)
		e := reflect.New(v.Type().Elem()).Elem()
		fillNonZero(t, e, path+"{}", n)
		v.SetMapIndex(k, e)
	case reflect.String:
		v.SetString(fmt.Sprintf("v%d", *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	default:
		t.Fatalf("%s: cannot fill a %s; teach fillNonZero", path, v.Type())
	}
	if v.IsZero() {
		t.Fatalf("%s: still zero after filling", path)
	}
}
