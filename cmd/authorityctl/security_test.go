package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/testcerts"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSecurityTLS runs authorityctl against an embedded etcd requiring TLS
// client certificates: the right CA, certificate and key work; a wrong one
// is a connection error (exit 3) that says TLS is the likely cause.
func TestSecurityTLS(t *testing.T) {
	certs := testcerts.New(t)
	srv := etcdtest.StartSecure(t, etcdtest.TLS{
		CertFile: certs.Server.CertFile, KeyFile: certs.Server.KeyFile,
		TrustedCAFile: certs.CA.CertFile, ClientCertAuth: true,
	})
	base := []string{"--endpoints", srv.Endpoint(), "--namespace", "/tls/", "--dial-timeout", "300ms"}
	with := func(extra ...string) []string { return append(append(append([]string{}, base...), extra...), "list") }

	out, errOut, code := cli(t, nil, with("--cacert", certs.CA.CertFile, "--cert", certs.Client.CertFile, "--key", certs.Client.KeyFile)...)
	require.Equal(t, exitOK, code, "stdout: %s\nstderr: %s", out, errOut)

	expired, err := certs.CA.Issue(testcerts.Client, "expired", testcerts.Expired())
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		args  []string
		cause string
	}{
		"client certificate of another CA": {with("--cacert", certs.CA.CertFile, "--cert", certs.OtherClient.CertFile, "--key", certs.OtherClient.KeyFile), "unknown certificate authority"},
		"no client certificate":            {with("--cacert", certs.CA.CertFile), "certificate required"},
		"expired client certificate":       {with("--cacert", certs.CA.CertFile, "--cert", expired.CertFile, "--key", expired.KeyFile), "it has expired"},
		"wrong CA":                         {with("--cacert", certs.OtherCA.CertFile, "--cert", certs.Client.CertFile, "--key", certs.Client.KeyFile), "signed by an unknown authority"},
		"plain text to a TLS server":       {with(), "requires TLS"},
	} {
		t.Run(name, func(t *testing.T) {
			_, errOut, code := cli(t, nil, tc.args...)
			require.Equal(t, exitConnect, code, errOut)
			require.Contains(t, errOut, srv.Endpoint())
			require.Contains(t, errOut, tc.cause)
			require.NotContains(t, errOut, "deadline exceeded")
		})
	}
}

// TestSecurityPasswordAuth runs authorityctl against an embedded etcd with
// authentication on.
func TestSecurityPasswordAuth(t *testing.T) {
	srv := etcdtest.StartSecure(t, etcdtest.TLS{})
	ctx := context.Background()
	c, err := clientv3.New(srv.Config())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, etcdtest.AddPrefixUser(ctx, c, "tenant", "tenant-pw", "/tenant/"))
	require.NoError(t, etcdtest.EnableAuth(ctx, c, "root-pw"))
	run := func(ns string, extra ...string) (string, int) {
		args := append([]string{"--endpoints", srv.Endpoint(), "--namespace", ns, "--dial-timeout", "2s"}, extra...)
		_, errOut, code := cli(t, nil, append(args, "list")...)
		return errOut, code
	}

	errOut, code := run("/any/", "--user", "root:root-pw")
	require.Equal(t, exitOK, code, errOut)
	errOut, code = run("/any/", "--user", "root", "--password", "wrong")
	require.Equal(t, exitConnect, code, errOut)
	require.Contains(t, errOut, "authentication failed")
	errOut, code = run("/any/")
	require.Equal(t, exitConnect, code, "no credentials: %s", errOut)

	// a user whose role grants only its prefix lists its namespace, and is
	// refused another
	errOut, code = listAs(t, map[string]string{"AUTHORITYCTL_PASSWORD": "tenant-pw"}, srv.Endpoint(), "/tenant/ns/", "tenant")
	require.Equal(t, exitOK, code, errOut)
	errOut, code = listAs(t, map[string]string{"AUTHORITYCTL_PASSWORD": "tenant-pw"}, srv.Endpoint(), "/other/", "tenant")
	require.Equal(t, exitConnect, code)
	require.Contains(t, errOut, `etcd user "tenant" lacks read permission on the namespace prefix "/other/"`)
	require.NotContains(t, errOut, "credentials")
}

// cli2 lists ns as user (password from env).
func listAs(t *testing.T, env map[string]string, endpoint, ns, user string) (string, int) {
	t.Helper()
	_, errOut, code := cli(t, env, "--endpoints", endpoint, "--namespace", ns, "--user", user, "--dial-timeout", "2s", "list")
	return errOut, code
}
