package preflight_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/testcerts"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
)

// TestClientTLSNamesTheFileAtFault checks ClientTLS's result for usable files
// and its *TLSFileError for each file it cannot use, and that New reports
// the same files as ErrInvalidArgument before dialling.
func TestClientTLSNamesTheFileAtFault(t *testing.T) {
	certs := testcerts.New(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")

	if c, err := preflight.ClientTLS("", "", ""); c != nil || err != nil {
		t.Fatalf("no files: %v, %v; want plain text", c, err)
	}
	c, err := preflight.ClientTLS(certs.CA.CertFile, certs.Client.CertFile, certs.Client.KeyFile)
	if err != nil || c.RootCAs == nil || len(c.Certificates) != 1 {
		t.Fatalf("usable files: %+v, %v", c, err)
	}
	for _, tc := range []struct {
		name          string
		ca, cert, key string
		file          preflight.TLSFile
		problem       preflight.TLSProblem
	}{
		{"MissingCA", missing, "", "", preflight.TLSFileCA, preflight.TLSUnreadable},
		{"CAWithoutCertificate", garbage, "", "", preflight.TLSFileCA, preflight.TLSNoCertificate},
		{"MissingCert", "", missing, certs.Client.KeyFile, preflight.TLSFileCert, preflight.TLSUnreadable},
		{"MissingKey", "", certs.Client.CertFile, missing, preflight.TLSFileKey, preflight.TLSUnreadable},
		{"NotAKeyPair", "", certs.Client.CertFile, certs.OtherClient.KeyFile, preflight.TLSFileCert, preflight.TLSNotAKeyPair},
		{"KeyWithoutCert", certs.CA.CertFile, "", certs.Client.KeyFile, preflight.TLSFileKey, preflight.TLSKeyWithoutCert},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := preflight.ClientTLS(tc.ca, tc.cert, tc.key)
			var fe *preflight.TLSFileError
			if !errors.As(err, &fe) || fe.File != tc.file || fe.Problem != tc.problem {
				t.Fatalf("ClientTLS: %v; want %s file %s", err, tc.file, tc.problem)
			}
			_, err = etcdstore.New(context.Background(), etcdstore.Config{
				Endpoints: []string{"127.0.0.1:1"}, CAFile: tc.ca, CertFile: tc.cert, KeyFile: tc.key,
			})
			if !errors.Is(err, authority.ErrInvalidArgument) || !errors.As(err, &fe) {
				t.Fatalf("New: %v; want ErrInvalidArgument with the file error", err)
			}
		})
	}
}
