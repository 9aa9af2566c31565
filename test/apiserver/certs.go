package apiserver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is what the API server needs to serve TLS and sign service account
// tokens, written as PEM files into one folder.
type pki struct {
	caPEM    []byte // the CA clients trust
	caFile   string
	certFile string // serving certificate, signed by the CA
	keyFile  string
	saPub    string // service account token verification key
	saKey    string // service account token signing key
}

// newPKI generates a throwaway CA, a serving certificate for ips and the
// API server's usual DNS names, and a service account key pair, all ECDSA
// P-256: fast to generate, and accepted for both TLS and token signing.
func newPKI(dir string, ips []net.IP) (*pki, error) {
	p := &pki{
		caFile:   filepath.Join(dir, "ca.crt"),
		certFile: filepath.Join(dir, "apiserver.crt"),
		keyFile:  filepath.Join(dir, "apiserver.key"),
		saPub:    filepath.Join(dir, "sa.pub"),
		saKey:    filepath.Join(dir, "sa.key"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kp-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, err
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serving := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  ips,
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, serving, ca, servingKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	files := []struct {
		path string
		typ  string
		der  func() ([]byte, error)
	}{
		{p.caFile, "CERTIFICATE", func() ([]byte, error) { return caDER, nil }},
		{p.certFile, "CERTIFICATE", func() ([]byte, error) { return servingDER, nil }},
		{p.keyFile, "PRIVATE KEY", func() ([]byte, error) { return x509.MarshalPKCS8PrivateKey(servingKey) }},
		{p.saKey, "PRIVATE KEY", func() ([]byte, error) { return x509.MarshalPKCS8PrivateKey(saKey) }},
		{p.saPub, "PUBLIC KEY", func() ([]byte, error) { return x509.MarshalPKIXPublicKey(crypto.PublicKey(saKey.Public())) }},
	}
	for _, f := range files {
		der, err := f.der()
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", f.path, err)
		}
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: der}), 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}
