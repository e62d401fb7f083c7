// Package testcerts generates throw-away X.509 certificates for TLS tests: a
// certificate authority, and server and client certificates it signs, written
// as PEM files into a directory the test owns (t.TempDir()). Nothing it makes
// is meant to be committed: every key is generated at test time.
package testcerts

import (
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
	"testing"
	"time"
)

// validity is how long generated certificates are valid (from an hour ago,
// so clock skew between test processes does not matter).
const validity = 24 * time.Hour

// CA is a certificate authority that signs server and client certificates.
type CA struct {
	// CertFile is the PEM file of the CA certificate (a trust anchor).
	CertFile string

	dir  string
	name string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Pair is a certificate and its private key, as PEM files.
type Pair struct {
	// CertFile is the PEM certificate file.
	CertFile string
	// KeyFile is the PEM private key file (PKCS #8).
	KeyFile string
}

// Role says what a certificate is for.
type Role int

const (
	// Server is a TLS server certificate for 127.0.0.1, ::1 and localhost
	// (also usable as a client certificate, as etcd's peer certificates are).
	Server Role = iota
	// Client is a TLS client certificate; its common name is the user name
	// etcd takes from it.
	Client
)

// IssueOption adjusts a certificate Issue makes.
type IssueOption func(*x509.Certificate)

// Expired makes the certificate expired an hour ago.
func Expired() IssueOption {
	return func(c *x509.Certificate) {
		c.NotBefore = time.Now().Add(-2 * validity)
		c.NotAfter = time.Now().Add(-time.Hour)
	}
}

// ForHosts makes a server certificate valid for the given DNS names only
// (instead of 127.0.0.1, ::1 and localhost): a client that dials an address
// sees a hostname mismatch.
func ForHosts(names ...string) IssueOption {
	return func(c *x509.Certificate) {
		c.IPAddresses = nil
		c.DNSNames = names
	}
}

// NewCA makes a certificate authority named name and writes its certificate
// to dir/<name>-ca.pem.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name + " test CA", Organization: []string{"testcerts"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{dir: dir, name: name, cert: cert, key: key, CertFile: filepath.Join(dir, name+"-ca.pem")}
	if err := writePEM(ca.CertFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return ca, nil
}

// Issue makes a certificate for commonName with the given role, signed by
// ca, and writes it to dir/<ca name>-<commonName>.pem and -key.pem.
func (ca *CA) Issue(role Role, commonName string, opts ...IssueOption) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: commonName, Organization: []string{"testcerts"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	switch role {
	case Server:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		tmpl.DNSNames = []string{"localhost"}
	case Client:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	default:
		return Pair{}, fmt.Errorf("testcerts: unknown role %d", role)
	}
	for _, o := range opts {
		o(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	base := filepath.Join(ca.dir, ca.name+"-"+commonName)
	p := Pair{CertFile: base + ".pem", KeyFile: base + "-key.pem"}
	if err := writePEM(p.CertFile, "CERTIFICATE", der); err != nil {
		return Pair{}, err
	}
	if err := writePEM(p.KeyFile, "PRIVATE KEY", pkcs8); err != nil {
		return Pair{}, err
	}
	return p, nil
}

// Set is what a TLS test usually needs: a CA with a server and a client
// certificate, and a second, unrelated CA with its own client certificate
// (for "wrong CA" and "untrusted client" cases).
type Set struct {
	// CA signs Server and Client.
	CA *CA
	// Server is the server certificate (127.0.0.1, ::1, localhost).
	Server Pair
	// Client is a client certificate with common name "client".
	Client Pair
	// OtherCA is a CA that neither side trusts.
	OtherCA *CA
	// OtherClient is a client certificate "client" signed by OtherCA.
	OtherClient Pair
	// OtherServer is a server certificate signed by OtherCA.
	OtherServer Pair
}

// New makes a Set in t.TempDir(), failing t on error.
func New(t testing.TB) *Set {
	t.Helper()
	s, err := NewSet(t.TempDir())
	if err != nil {
		t.Fatalf("testcerts: %v", err)
	}
	return s
}

// NewSet makes a Set in dir.
func NewSet(dir string) (*Set, error) {
	var (
		s   Set
		err error
	)
	if s.CA, err = NewCA(dir, "trusted"); err != nil {
		return nil, err
	}
	if s.Server, err = s.CA.Issue(Server, "server"); err != nil {
		return nil, err
	}
	if s.Client, err = s.CA.Issue(Client, "client"); err != nil {
		return nil, err
	}
	if s.OtherCA, err = NewCA(dir, "other"); err != nil {
		return nil, err
	}
	if s.OtherClient, err = s.OtherCA.Issue(Client, "client"); err != nil {
		return nil, err
	}
	if s.OtherServer, err = s.OtherCA.Issue(Server, "server"); err != nil {
		return nil, err
	}
	return &s, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
