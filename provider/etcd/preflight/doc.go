// Package preflight holds what the etcd provider and authorityctl check
// before they work on an etcd cluster: the client TLS configuration
// (ClientTLS), why an endpoint cannot be reached (ProbeEndpoint), the server
// versions accepted and warned about (MinServerVersion, ServerVersionWarning)
// and the server flags the provider needs (ServerRequirements). It talks to
// no store: etcd.New and `authorityctl doctor` / `connect` use it.
package preflight
