package server

import (
	"errors"
	"fmt"
	"mime"
	"net/http"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// jsonWrites guards every write to the status API (any method but GET and
// HEAD): its body must be statusapi.ContentType (415 otherwise: a browser
// sends text/plain and form bodies cross-origin without a CORS preflight,
// so a page open on the node could otherwise post to loopback) and at most
// statusapi.MaxRequestBytes (413 beyond, before or while it is read).
func jsonWrites(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != statusapi.ContentType {
			w.Header().Set("Accept", statusapi.ContentType)
			http.Error(w, "the status API takes writes as Content-Type: "+statusapi.ContentType+" only",
				http.StatusUnsupportedMediaType)
			return
		}
		if r.ContentLength > statusapi.MaxRequestBytes {
			http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, statusapi.MaxRequestBytes)
		next.ServeHTTP(w, r)
	})
}

var tooLarge = fmt.Sprintf("request body larger than %d bytes", statusapi.MaxRequestBytes)

// bodyError answers a request whose body could not be read or decoded:
// 413 when it outgrew the bound, else 400.
func bodyError(w http.ResponseWriter, err error) {
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
		return
	}
	http.Error(w, "request body: "+err.Error(), http.StatusBadRequest)
}
