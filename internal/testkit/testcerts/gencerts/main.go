// Command gencerts writes a throw-away certificate authority and the
// certificates a local TLS etcd cluster needs into a directory, for CI
// (.ci/run) and manual checks:
//
//	go run ./internal/testkit/testcerts/gencerts DIR [CLIENT-NAME...]
//
// It writes DIR/ci-ca.pem (the CA), DIR/ci-server.pem and -key.pem (server
// and peer certificate for 127.0.0.1, ::1 and localhost) and, for every
// CLIENT-NAME, DIR/ci-<name>.pem and -key.pem (a client certificate with that
// common name), and DIR/ci-jwt-key.pem and ci-jwt-pub.pem (an ES256 key pair
// for etcd's --auth-token jwt: simple tokens are valid only on the member
// that issued them, so a client balanced over a cluster's members meets
// "invalid auth token"). Every key is generated anew; the certificates are
// valid for a day.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"

	"github.com/zlink-systems/authority/internal/testkit/testcerts"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gencerts DIR [CLIENT-NAME...]")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "gencerts:", err)
		os.Exit(1)
	}
}

// run writes the CA, the server certificate and one client certificate per
// name into dir, printing each file it wrote.
func run(dir string, clients []string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := testcerts.NewCA(dir, "ci")
	if err != nil {
		return err
	}
	fmt.Println(ca.CertFile)
	server, err := ca.Issue(testcerts.Server, "server")
	if err != nil {
		return err
	}
	fmt.Println(server.CertFile)
	for _, name := range clients {
		p, err := ca.Issue(testcerts.Client, name)
		if err != nil {
			return err
		}
		fmt.Println(p.CertFile)
	}
	return writeJWTKeys(dir)
}

// writeJWTKeys writes the ES256 key pair etcd signs its auth tokens with.
func writeJWTKeys(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	priv, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	for name, block := range map[string]*pem.Block{
		"ci-jwt-key.pem": {Type: "PRIVATE KEY", Bytes: priv},
		"ci-jwt-pub.pem": {Type: "PUBLIC KEY", Bytes: pub},
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return err
		}
		fmt.Println(path)
	}
	return nil
}
