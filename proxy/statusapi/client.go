package statusapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Client reads the status API of one kp proxy.
type Client struct {
	// BaseURL is the server's root: "http://kp" through SocketClient's
	// transport, or an httptest server's URL in tests.
	BaseURL string
	// HTTP is the client to use; nil means http.DefaultClient.
	HTTP *http.Client
}

// SocketClient returns a Client of the status API on the Unix socket at
// path (DefaultSocket when empty). Opening it takes root on the node (or
// kubectl exec into kp's pod): a non-root caller gets "permission denied".
func SocketClient(path string) *Client {
	if path == "" {
		path = DefaultSocket
	}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	return &Client{BaseURL: "http://kp", HTTP: &http.Client{Transport: &http.Transport{DialContext: dial, Proxy: nil}}}
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

// Migration fetches /kp/v1/migration (nil when no switch was asked for).
func (c *Client) Migration(ctx context.Context) (*Migration, error) {
	var m *Migration
	return m, c.get(ctx, MigrationPath, nil, &m)
}

// RequestMigration posts a mode switch and returns its progress record.
func (c *Client) RequestMigration(ctx context.Context, req MigrationRequest) (*Migration, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	u := strings.TrimSuffix(c.BaseURL, "/") + MigrationPath
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("status API: %w", err)
	}
	r.Header.Set("Content-Type", "application/json")
	resp, err := c.httpClient().Do(r)
	if err != nil {
		return nil, fmt.Errorf("status API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, &HTTPError{Method: http.MethodPost, URL: u, Status: resp.Status, Code: resp.StatusCode, Body: strings.TrimSpace(string(msg))}
	}
	var m Migration
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		return nil, fmt.Errorf("status API: POST %s: decode: %w", u, err)
	}
	return &m, nil
}

// Snapshot fetches /kp/v1/snapshot.
func (c *Client) Snapshot(ctx context.Context) (*Snapshot, error) {
	var s Snapshot
	return &s, c.get(ctx, SnapshotPath, nil, &s)
}

// Inventory fetches /kp/v1/inventory.
func (c *Client) Inventory(ctx context.Context) (*Inventory, error) {
	var inv Inventory
	return &inv, c.get(ctx, InventoryPath, nil, &inv)
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP == nil {
		return http.DefaultClient
	}
	return c.HTTP
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
		return &HTTPError{Method: http.MethodGet, URL: u, Status: resp.Status, Code: resp.StatusCode, Body: strings.TrimSpace(string(body))}
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("status API: GET %s: decode: %w", u, err)
	}
	return nil
}

// HTTPError is an answer of the status API other than the one asked for.
// To POST /kp/v1/migration, 409 Conflict is kp refusing the switch (another
// one under way, or a switch kp does not make), having changed nothing.
type HTTPError struct {
	Method, URL string
	Status      string // "409 Conflict"
	Code        int
	Body        string // the start of the answer's body: kp's reason
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("status API: %s %s: %s: %s", e.Method, e.URL, e.Status, e.Body)
}
