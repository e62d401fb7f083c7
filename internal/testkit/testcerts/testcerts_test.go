package testcerts_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/testkit/testcerts"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func load(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	block, _ := pem.Decode(raw)
	require.NotNil(t, block, "%s holds no PEM", file)
	c, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return c
}

func pool(t *testing.T, ca *testcerts.CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(load(t, ca.CertFile))
	return p
}

func TestSetVerifiesOnlyAgainstItsCA(t *testing.T) {
	s := testcerts.New(t)
	for _, name := range []string{"127.0.0.1", "::1", "localhost"} {
		_, err := load(t, s.Server.CertFile).Verify(x509.VerifyOptions{Roots: pool(t, s.CA), DNSName: name})
		require.NoError(t, err, name)
	}
	_, err := load(t, s.Server.CertFile).Verify(x509.VerifyOptions{Roots: pool(t, s.CA), DNSName: "example.com"})
	require.Error(t, err)
	client := x509.VerifyOptions{Roots: pool(t, s.CA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	_, err = load(t, s.Client.CertFile).Verify(client)
	require.NoError(t, err)
	require.Equal(t, "client", load(t, s.Client.CertFile).Subject.CommonName)
	_, err = load(t, s.OtherClient.CertFile).Verify(client)
	require.Error(t, err, "a certificate of the other CA")
	_, err = load(t, s.Client.CertFile).Verify(x509.VerifyOptions{Roots: pool(t, s.CA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	require.Error(t, err, "a client certificate is no server certificate")
	for _, p := range []testcerts.Pair{s.Server, s.Client, s.OtherClient, s.OtherServer} {
		_, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
		require.NoError(t, err)
		info, err := os.Stat(p.KeyFile)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "private keys are private")
	}
}

func TestExpired(t *testing.T) {
	ca, err := testcerts.NewCA(t.TempDir(), "ca")
	require.NoError(t, err)
	p, err := ca.Issue(testcerts.Client, "late", testcerts.Expired())
	require.NoError(t, err)
	c := load(t, p.CertFile)
	require.True(t, c.NotAfter.Before(time.Now()))
	_, err = c.Verify(x509.VerifyOptions{Roots: pool(t, ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	var invalid x509.CertificateInvalidError
	require.ErrorAs(t, err, &invalid)
	require.Equal(t, x509.Expired, invalid.Reason)
}
