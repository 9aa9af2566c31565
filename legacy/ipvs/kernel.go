package ipvs

import (
	"github.com/moby/ipvs"
)

// Handle is the part of github.com/moby/ipvs's Handle kp uses: an IPVS
// netlink socket in one network namespace. Fake implements it for tests.
type Handle interface {
	GetServices() ([]*ipvs.Service, error)
	GetService(s *ipvs.Service) (*ipvs.Service, error)
	IsServicePresent(s *ipvs.Service) bool
	NewService(s *ipvs.Service) error
	UpdateService(s *ipvs.Service) error
	DelService(s *ipvs.Service) error
	GetDestinations(s *ipvs.Service) ([]*ipvs.Destination, error)
	NewDestination(s *ipvs.Service, d *ipvs.Destination) error
	UpdateDestination(s *ipvs.Service, d *ipvs.Destination) error
	DelDestination(s *ipvs.Service, d *ipvs.Destination) error
	SetConfig(c *ipvs.Config) error
	Close()
}

// newHandle opens an IPVS socket in the calling thread's namespace.
func newHandle() (Handle, error) { return ipvs.New("") }
