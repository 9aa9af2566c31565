// Package proxy is kp's mode-independent core: the Service and Endpoint model,
// the Sink and Source contracts the sources (proxy/source) feed, change
// tracking into immutable State snapshots, endpoint selection, the Backend
// interface every mode implements with its optional capabilities, and the
// automatic mode choice (FirstThatRuns). It imports no I/O library: the
// sync loop and the servers are proxy/server's.
package proxy
