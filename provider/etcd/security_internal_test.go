package etcd

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/testcerts"
)

// TestConnectFailureNamesTheCause checks the probe that explains why a
// client cannot reach etcd (the client itself only reports its context's
// deadline) against a TLS server requiring client certificates, a plain
// server and a closed port.
func TestConnectFailureNamesTheCause(t *testing.T) {
	certs := testcerts.New(t)
	expired, err := certs.CA.Issue(testcerts.Client, "expired", testcerts.Expired())
	require.NoError(t, err)
	secure := etcdtest.StartSecure(t, etcdtest.TLS{
		CertFile: certs.Server.CertFile, KeyFile: certs.Server.KeyFile,
		TrustedCAFile: certs.CA.CertFile, ClientCertAuth: true,
	})
	plain := etcdtest.StartSecure(t, etcdtest.TLS{})
	elsewhere, err := certs.CA.Issue(testcerts.Server, "elsewhere", testcerts.ForHosts("etcd.example"))
	require.NoError(t, err)
	misnamed := etcdtest.StartSecure(t, etcdtest.TLS{CertFile: elsewhere.CertFile, KeyFile: elsewhere.KeyFile})
	stale, err := certs.CA.Issue(testcerts.Server, "stale", testcerts.Expired())
	require.NoError(t, err)
	outdated := etcdtest.StartSecure(t, etcdtest.TLS{CertFile: stale.CertFile, KeyFile: stale.KeyFile})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())

	clientTLS := func(pair testcerts.Pair, ca *testcerts.CA) *tls.Config {
		c, err := etcdtest.ClientTLS(pair.CertFile, pair.KeyFile, ca.CertFile)
		require.NoError(t, err)
		return c
	}
	cause := context.DeadlineExceeded
	for _, tc := range []struct {
		name     string
		endpoint string
		tls      *tls.Config
		sentinel error
		message  string
	}{
		{"RightCertificates", secure.Endpoint(), clientTLS(certs.Client, certs.CA), authority.ErrUnavailable, "etcd read did not complete"},
		{"ClientCertificateOfAnotherCA", secure.Endpoint(), clientTLS(certs.OtherClient, certs.CA), authority.ErrAccessDenied, "signed by an unknown certificate authority"},
		{"ExpiredClientCertificate", "https://" + secure.Endpoint(), clientTLS(expired, certs.CA), authority.ErrAccessDenied, "refused the client certificate: it has expired"},
		{"NoClientCertificate", secure.Endpoint(), clientTLS(testcerts.Pair{}, certs.CA), authority.ErrAccessDenied, "requires a client certificate (certificate required)"},
		{"WrongCA", secure.Endpoint(), clientTLS(certs.Client, certs.OtherCA), authority.ErrUnavailable, "signed by an unknown authority"},
		{"HostnameMismatch", misnamed.Endpoint(), clientTLS(testcerts.Pair{}, certs.CA), authority.ErrUnavailable, `hostname mismatch: the certificate of etcd at ` + misnamed.Endpoint() + ` is not valid for "127.0.0.1" (it names etcd.example)`},
		{"ExpiredServerCertificate", outdated.Endpoint(), clientTLS(testcerts.Pair{}, certs.CA), authority.ErrUnavailable, "has expired"},
		{"PlainClientOfTLSServer", secure.Endpoint(), nil, authority.ErrUnavailable, "requires TLS"},
		{"TLSClientOfPlainServer", plain.Endpoint(), clientTLS(certs.Client, certs.CA), authority.ErrUnavailable, "may not speak TLS"},
		{"PlainClientOfPlainServer", "http://" + plain.Endpoint(), nil, authority.ErrUnavailable, "etcd read did not complete"},
		{"NothingListening", closed, nil, authority.ErrUnavailable, "cannot connect to etcd at " + closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := connectFailure(context.Background(), tc.endpoint, tc.tls, cause)
			require.ErrorIs(t, err, tc.sentinel)
			require.Contains(t, err.Error(), tc.message)
		})
	}
}
