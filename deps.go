//go:build tools

package authority

import (
	_ "github.com/anishathalye/porcupine"
	_ "github.com/google/uuid"
	_ "github.com/spf13/cobra"
	_ "github.com/stretchr/testify/require"
	_ "github.com/tidwall/btree"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "go.uber.org/goleak"
	_ "go.yaml.in/yaml/v3"
	_ "pgregory.net/rapid"
)
