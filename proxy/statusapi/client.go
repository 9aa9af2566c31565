package statusapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client reads the status API of one kp proxy.
type Client struct {
	// BaseURL is the server's root, e.g. "http://127.0.0.1:10249".
	BaseURL string
	// HTTP is the client to use; nil means http.DefaultClient.
	HTTP *http.Client
}

// Status fetches /kp/v1/status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.get(ctx, StatusPath, nil, &s)
}

// Services fetches /kp/v1/services, restricted to a namespace and a Service
// name when they are not empty.
func (c *Client) Services(ctx context.Context, namespace, service string) (*Services, error) {
	q := url.Values{}
	if namespace != "" {
		q.Set("namespace", namespace)
	}
	if service != "" {
		q.Set("service", service)
	}
	var s Services
	return &s, c.get(ctx, ServicesPath, q, &s)
}

func (c *Client) get(ctx context.Context, path string, q url.Values, out any) error {
	u := strings.TrimSuffix(c.BaseURL, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("status API: %w", err)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("status API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status API: GET %s: %s: %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("status API: GET %s: decode: %w", u, err)
	}
	return nil
}
