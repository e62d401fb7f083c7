package preflight

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLSFile names one of the files ClientTLS reads.
type TLSFile string

// The files ClientTLS reads.
const (
	// TLSFileCA is the CA bundle that verifies the servers (etcd.Config.CAFile).
	TLSFileCA TLSFile = "CA"
	// TLSFileCert is the client certificate (etcd.Config.CertFile).
	TLSFileCert TLSFile = "certificate"
	// TLSFileKey is the client private key (etcd.Config.KeyFile).
	TLSFileKey TLSFile = "key"
)

// TLSProblem says what is wrong with a TLS file.
type TLSProblem string

// The problems ClientTLS reports.
const (
	// TLSUnreadable: the file cannot be read (Err says why).
	TLSUnreadable TLSProblem = "cannot be read"
	// TLSNoCertificate: the CA file holds no PEM certificate.
	TLSNoCertificate TLSProblem = "holds no PEM certificate"
	// TLSNotAKeyPair: the certificate and key files were read but are not a
	// usable key pair (Err says why); File is TLSFileCert.
	TLSNotAKeyPair TLSProblem = "is not a usable key pair with the key file"
	// TLSKeyWithoutCert: a key file was given without a certificate file.
	TLSKeyWithoutCert TLSProblem = "is given without a certificate file"
)

// TLSFileError is ClientTLS's error for a file it cannot use.
type TLSFileError struct {
	// File says which file is at fault.
	File TLSFile
	// Path is the file's path.
	Path string
	// Problem says what is wrong with it.
	Problem TLSProblem
	// Err is the underlying error, if any.
	Err error
}

// Error implements error.
func (e *TLSFileError) Error() string {
	msg := fmt.Sprintf("etcd TLS %s file %q %s", e.File, e.Path, e.Problem)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the underlying error.
func (e *TLSFileError) Unwrap() error { return e.Err }

// ClientTLS builds the client TLS configuration of a CA file (verifying the
// servers; empty: the system roots) and a client certificate and key (empty:
// none), TLS 1.2 or later. It returns nil when caFile and certFile are both
// empty (plain text). A file it cannot use is a *TLSFileError. etcd.New uses
// it for Config.CAFile/CertFile/KeyFile, and authorityctl for its flags.
func ClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if keyFile != "" && certFile == "" {
		return nil, &TLSFileError{File: TLSFileKey, Path: keyFile, Problem: TLSKeyWithoutCert}
	}
	if caFile == "" && certFile == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, &TLSFileError{File: TLSFileCA, Path: caFile, Problem: TLSUnreadable, Err: err}
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &TLSFileError{File: TLSFileCA, Path: caFile, Problem: TLSNoCertificate}
		}
	}
	if certFile != "" {
		certPEM, err := os.ReadFile(certFile)
		if err != nil {
			return nil, &TLSFileError{File: TLSFileCert, Path: certFile, Problem: TLSUnreadable, Err: err}
		}
		keyPEM, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, &TLSFileError{File: TLSFileKey, Path: keyFile, Problem: TLSUnreadable, Err: err}
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, &TLSFileError{File: TLSFileCert, Path: certFile, Problem: TLSNotAKeyPair, Err: err}
		}
		t.Certificates = []tls.Certificate{pair}
	}
	return t, nil
}
