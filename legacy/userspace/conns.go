package userspace

import (
	"context"
	"net"
	"sync"
)

// connSet is every socket the proxy holds for a client or an endpoint, so
// that shutdown can wait for them and, past its bound, close them.
type connSet struct {
	mu      sync.Mutex
	open    map[net.Conn]struct{}
	closing bool
	wg      sync.WaitGroup
}

func newConnSet() *connSet { return &connSet{open: map[net.Conn]struct{}{}} }

// add records c; false when shutting down (the caller closes c).
func (s *connSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.open[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *connSet) done(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.open[c]; ok {
		delete(s.open, c)
		s.wg.Done()
	}
}

func (s *connSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

// drain refuses new sockets, waits for the open ones to finish until ctx
// ends, then closes those left; it returns how many it had to close.
func (s *connSet) drain(ctx context.Context) int {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	finished := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return 0
	case <-ctx.Done():
	}
	s.mu.Lock()
	n := len(s.open)
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	<-finished
	return n
}
