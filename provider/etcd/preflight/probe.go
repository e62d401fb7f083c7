package preflight

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	authority "github.com/zlink-systems/authority"
)

// probeTimeout bounds each step of ProbeEndpoint.
const probeTimeout = time.Second

// ProbeEndpoint opens a connection to an etcd endpoint ("host:port" or a
// URL) the way a client with tlsCfg (nil: plain text) would, and returns a
// typed error naming why such a client cannot talk to it, or nil when it
// finds nothing wrong. A gRPC client only reports such failures as its
// context's deadline; etcd.New calls this when its first request fails, and
// authorityctl when no endpoint answers. The causes it names:
//   - ErrUnavailable: nothing listens; TLS on one side only; the server's
//     certificate is signed by an unknown authority, is expired or not yet
//     valid, or is not valid for the endpoint's host name.
//   - ErrAccessDenied: the server refused the client certificate: none was
//     given (certificate required), it is signed by a CA the server does not
//     trust (unknown certificate authority), or it is expired.
//
// It waits at most a second for each step, also after ctx ended.
func ProbeEndpoint(ctx context.Context, endpoint string, tlsCfg *tls.Config) error {
	addr := endpoint
	if i := strings.Index(addr, "://"); i >= 0 {
		addr = addr[i+3:]
	}
	addr = strings.TrimSuffix(addr, "/")
	if strings.HasPrefix(endpoint, "unix") || addr == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf("cannot connect to etcd at %s", addr), err)
	}
	defer conn.Close()
	if tlsCfg == nil {
		// Does the server speak TLS? Try a handshake that trusts anything.
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // probe only
		var remote *net.OpError
		if err := tc.HandshakeContext(ctx); err == nil || errors.As(err, &remote) && remote.Op == "remote error" {
			return authority.Wrap(authority.ErrUnavailable,
				fmt.Sprintf("etcd at %s requires TLS; set the CA file (and a client certificate and key if it asks for one)", addr), nil)
		}
		return nil
	}
	return probeTLS(ctx, conn, addr, tlsCfg)
}

// probeTLS makes a TLS handshake on conn with a copy of tlsCfg and names
// what went wrong (nil: nothing).
func probeTLS(ctx context.Context, conn net.Conn, addr string, tlsCfg *tls.Config) error {
	cfg := tlsCfg.Clone()
	if cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	cfg.NextProtos = []string{"h2"}
	// Record what the server asked of the client: the Go client sends no
	// certificate when none of its own is signed by a CA the server names.
	var asked, unsupported bool
	if len(cfg.Certificates) > 0 && cfg.GetClientCertificate == nil {
		certs := cfg.Certificates
		cfg.Certificates = nil
		cfg.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			asked = true
			if cri.SupportsCertificate(&certs[0]) != nil {
				unsupported = true
				return &tls.Certificate{}, nil
			}
			return &certs[0], nil
		}
	}
	tc := tls.Client(conn, cfg)
	err := tc.HandshakeContext(ctx)
	if err == nil {
		// With TLS 1.3 the server checks the client certificate after the
		// client finished its handshake: its refusal is the first record.
		_ = tc.SetReadDeadline(time.Now().Add(probeTimeout))
		_, err = tc.Read(make([]byte, 1))
	}
	var (
		remote *net.OpError
		verify *tls.CertificateVerificationError
		header tls.RecordHeaderError
	)
	switch {
	case err == nil:
	case errors.As(err, &verify):
		return serverCertificateError(addr, cfg.ServerName, verify)
	case errors.As(err, &header):
		return authority.Wrap(authority.ErrUnavailable,
			fmt.Sprintf("etcd at %s does not speak TLS; unset the CA, certificate and key files", addr), err)
	case errors.Is(err, io.EOF):
		return authority.Wrap(authority.ErrUnavailable,
			fmt.Sprintf("etcd at %s closed the connection during the TLS handshake: it may not speak TLS", addr), err)
	case errors.As(err, &remote) && remote.Op == "remote error":
		return clientCertificateError(addr, remote.Err.Error(), len(tlsCfg.Certificates) > 0, asked && unsupported, err)
	}
	return nil
}

// serverCertificateError names why the client does not accept the server's
// certificate.
func serverCertificateError(addr, host string, verify *tls.CertificateVerificationError) error {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	msg := fmt.Sprintf("the certificate of etcd at %s is not trusted", addr)
	switch {
	case errors.As(verify.Err, &unknown):
		msg = fmt.Sprintf("the certificate of etcd at %s is signed by an unknown authority: the configured CA file did not sign it", addr)
	case errors.As(verify.Err, &hostname):
		msg = fmt.Sprintf("hostname mismatch: the certificate of etcd at %s is not valid for %q (it names %s)",
			addr, host, certificateNames(hostname.Certificate))
	case errors.As(verify.Err, &invalid) && invalid.Reason == x509.Expired:
		c := invalid.Cert
		msg = fmt.Sprintf("the certificate of etcd at %s has expired or is not yet valid (valid %s to %s)",
			addr, c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
	}
	return authority.Wrap(authority.ErrUnavailable, msg, verify)
}

// certificateNames lists the host names and addresses a certificate is
// valid for.
func certificateNames(c *x509.Certificate) string {
	var names []string
	names = append(names, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		return "no host name"
	}
	return strings.Join(names, ", ")
}

// clientCertificateError names why the server refused the handshake, from
// its TLS alert ("certificate required", "unknown certificate authority",
// "expired certificate", "bad certificate", ...). hasCert says the client
// was configured with a certificate; notSigned that it was not sent because
// the server trusts none of the CAs that signed it.
func clientCertificateError(addr, alert string, hasCert, notSigned bool, err error) error {
	var msg string
	switch {
	case strings.Contains(alert, "certificate required") && !hasCert:
		msg = fmt.Sprintf("etcd at %s requires a client certificate (certificate required); set the certificate and key files", addr)
	case strings.Contains(alert, "unknown certificate authority"),
		strings.Contains(alert, "certificate required") && notSigned:
		msg = fmt.Sprintf("etcd at %s refused the client certificate: it is signed by an unknown certificate authority (not one its --trusted-ca-file names)", addr)
	case strings.Contains(alert, "expired certificate"):
		msg = fmt.Sprintf("etcd at %s refused the client certificate: it has expired", addr)
	case strings.Contains(alert, "certificate"):
		msg = fmt.Sprintf("etcd at %s refused the client certificate", addr)
	default:
		return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf("TLS handshake with etcd at %s failed", addr), err)
	}
	return authority.Wrap(authority.ErrAccessDenied, msg, err)
}
