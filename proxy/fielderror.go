package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// FieldError reports one invalid field of one API object. Validation never
// rejects a whole object for one bad field: the part the field belongs to (a
// Service port, an endpoint, one address) is skipped and the rest is used.
type FieldError struct {
	Kind   string // "Service", "EndpointSlice", "Node"
	Object types.NamespacedName
	Field  string // field path, e.g. "spec.ports[1].port"
	Err    error
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s %s: %s: %v", e.Kind, e.objectName(), e.Field, e.Err)
}

// objectName is namespace/name, or just the name for cluster-scoped objects.
func (e *FieldError) objectName() string {
	if e.Object.Namespace == "" {
		return e.Object.Name
	}
	return e.Object.String()
}

func (e *FieldError) Unwrap() error { return e.Err }

// logFieldErrors logs each validation error once, with the fields operators
// filter on (kind, object, field, error).
func logFieldErrors(log *slog.Logger, errs []error) {
	for _, err := range errs {
		var fe *FieldError
		if errors.As(err, &fe) {
			log.Warn("invalid field skipped", "kind", fe.Kind, "object", fe.objectName(),
				"field", fe.Field, "error", fe.Err.Error())
			continue
		}
		log.Warn("invalid object", "error", err.Error())
	}
}

// errorsKey is a stable text for a list of errors, to tell whether the errors
// of an object changed between two versions of it.
func ErrorsKey(errs []error) string {
	var b strings.Builder
	for _, err := range errs {
		b.WriteString(err.Error())
		b.WriteByte('\n')
	}
	return b.String()
}
