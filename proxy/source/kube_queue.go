package source

import (
	"log/slog"
	"sync"

	"k8s.io/client-go/tools/cache"
)

// streamQueue is the queue between a reflector and its keyStore: a
// client-go RealFIFO whose known objects are the keyStore, plus the
// transform the reflector applies to a streamed list (watch-list), which
// it holds whole until the list's end before handing it to the queue.
//
//   - The first list, streamed: each object is delivered as it arrives and
//     the reflector keeps a stand-in (keyStore.deliverStreamed).
//   - A later one (a watch that could not resume): objects are compacted
//     (compact; nil keeps them), and delivered from the queue, after the
//     events queued before it.
//
// The queue itself transforms nothing: a listed (not streamed) object is
// held by the list response while it is queued, so a compact copy would
// add to the peak, not take from it, and a watched one goes to the sink at
// once.
type streamQueue struct {
	*cache.RealFIFO
	deliver, compact cache.TransformFunc
	kind             string
	log              *slog.Logger

	mu       sync.Mutex
	listed   bool // the first list reached the queue
	streamed int  // objects of the first list delivered as they streamed
}

func newStreamQueue(w kindWatch, compact cache.TransformFunc, log *slog.Logger) *streamQueue {
	return &streamQueue{
		kind: w.kind,
		log:  log,
		RealFIFO: cache.NewRealFIFOWithOptions(cache.RealFIFOOptions{
			Name:         w.kind,
			KeyFunction:  cache.DeletionHandlingMetaNamespaceKeyFunc,
			KnownObjects: w.known,
		}),
		deliver: w.streamed,
		compact: compact,
	}
}

// Transformer is what the reflector applies to a streamed list
// (cache.TransformingStore).
func (q *streamQueue) Transformer() cache.TransformFunc { return q.transform }

func (q *streamQueue) transform(obj any) (any, error) {
	q.mu.Lock()
	listed := q.listed
	if !listed {
		q.streamed++
	}
	q.mu.Unlock()
	switch {
	case !listed:
		return q.deliver(obj)
	case q.compact != nil:
		return q.compact(obj)
	}
	return obj, nil
}

// Replace takes a list (streamed or not) from the reflector.
func (q *streamQueue) Replace(list []any, resourceVersion string) error {
	q.mu.Lock()
	if !q.listed {
		q.log.Debug("initial list", "kind", q.kind, "objects", len(list), "streamed", q.streamed > 0)
	}
	q.listed = true
	q.mu.Unlock()
	return q.RealFIFO.Replace(list, resourceVersion)
}
