// Command echo is the test servers' and the demo's echo server: every TCP
// connection and every UDP datagram is answered with one line, the server's
// name and the client address it saw ("pod-1 10.0.2.2:40312"), so a test can
// tell which endpoint a Service chose and whether the source was masqueraded.
//
// With -dial it is the matching client instead: it prints the reply of one
// server and exits non-zero if there was none. Given an http:// URL it
// fetches it and prints the body, failing unless the status is 2xx (scripts
// use that to poll kp's /healthz without curl).
//
//	echo -name pod-0 -listen :8080,:8081 -udp :5353
//	echo -dial 10.96.0.10:80 -net tcp -timeout 2s
//	echo -dial http://127.0.0.1:10256/healthz
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	name := flag.String("name", "", "name to answer with (default: the host name)")
	listen := flag.String("listen", "", "comma-separated TCP addresses to listen on, e.g. :8080,:8081")
	udp := flag.String("udp", "", "comma-separated UDP addresses to listen on, e.g. :5353")
	dial := flag.String("dial", "", "client mode: address to ask, e.g. 10.96.0.10:80 or [fd00::1]:80")
	network := flag.String("net", "tcp", "client mode: tcp or udp")
	timeout := flag.Duration("timeout", 2*time.Second, "client mode: give up after this long")
	flag.Parse()

	if *dial != "" {
		ask := Ask
		if strings.HasPrefix(*dial, "http://") {
			ask = get
		}
		reply, err := ask(*network, *dial, *timeout)
		if err != nil {
			fmt.Fprintf(os.Stderr, "echo: %v\n", err)
			os.Exit(1)
		}
		fmt.Println(reply)
		return
	}

	if *name == "" {
		*name, _ = os.Hostname()
	}
	if *listen == "" && *udp == "" {
		fmt.Fprintln(os.Stderr, "echo: nothing to do: give -listen, -udp or -dial")
		os.Exit(2)
	}
	// UDP sockets are bound before TCP ones so that whoever waits for a TCP
	// port to accept knows the UDP ports are bound too.
	errc := make(chan error)
	for _, addr := range split(*udp) {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "echo: %v\n", err)
			os.Exit(1)
		}
		go func() { errc <- serveUDP(c, *name) }()
	}
	for _, addr := range split(*listen) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "echo: %v\n", err)
			os.Exit(1)
		}
		go func() { errc <- serveTCP(l, *name) }()
	}
	fmt.Printf("echo %s listening tcp=%s udp=%s\n", *name, *listen, *udp)
	err := <-errc
	fmt.Fprintf(os.Stderr, "echo: %v\n", err)
	os.Exit(1)
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func serveTCP(l net.Listener, name string) error {
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go func() {
			defer c.Close()
			// Answer at once, without reading: plain clients (nc, the -dial
			// mode, the harness) need not send anything.
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			line := name + " " + c.RemoteAddr().String() + "\n"
			_, _ = io.WriteString(c, line)
		}()
	}
}

func serveUDP(c net.PacketConn, name string) error {
	buf := make([]byte, 2048)
	for {
		_, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		_, _ = c.WriteTo([]byte(name+" "+from.String()+"\n"), from)
	}
}

// Ask sends one request to an echo server and returns its reply line
// without the newline.
func Ask(network, addr string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if strings.HasPrefix(network, "udp") {
		if _, err := c.Write([]byte("?\n")); err != nil {
			return "", err
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read reply from %s %s: %w", network, addr, err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// get fetches url and returns its body; a status other than 2xx is an error.
func get(_, url string, timeout time.Duration) (string, error) {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: nil}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return strings.TrimSpace(string(body)), nil
}
