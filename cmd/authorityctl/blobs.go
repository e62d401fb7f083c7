package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// blobView is a relocation blob (its content is not printed).
type blobView struct {
	Reference string `json:"reference"`
	Size      int    `json:"size"`
	SHA256    string `json:"sha256"`
	ExpiresAt string `json:"expiresAt"`
	Revision  int64  `json:"revision"`
}

func newBlobsCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "blobs",
		Short: "List unexpired relocation blobs (activation recovery data) with their size and digest",
		Long: `List the relocation blobs the store serves: the recovery data an Instance
activation hands to its next node (a row's activationRecovery names its
reference and digest). Expired blobs awaiting their lease are left out; the
content itself is not printed.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.raw(cmd, func(ctx context.Context, c *clientv3.Client) error {
				blobs, err := listBlobs(ctx, c, g.namespace, g.skipUndecodable)
				if err != nil {
					return err
				}
				now := time.Now()
				t := &table{header: []string{"REFERENCE", "SIZE", "SHA256", "EXPIRES-IN"}, wide: []string{"REVISION"}}
				return renderItems(g, blobs, t, func(t *table, b blobView) {
					at, _ := time.Parse(time.RFC3339, b.ExpiresAt)
					t.add(b.Reference, strconv.Itoa(b.Size), b.SHA256, until(at, now), strconv.FormatInt(b.Revision, 10))
				})
			})
		},
	}
}

func listBlobs(ctx context.Context, c *clientv3.Client, ns string, skip func(error)) ([]blobView, error) {
	now := time.Now()
	return listEntries(ctx, c, ns, entryQuery{prefix: schema.Prefix(ns, schema.EntryBlob), undecodable: skip}, func(le listedEntry) (blobView, bool, error) {
		e := le.entry
		if e.Blob == nil || e.Expired(now) {
			return blobView{}, false, nil
		}
		sum := sha256.Sum256(e.Blob.Data)
		return blobView{Reference: string(e.BlobReference), Size: len(e.Blob.Data), SHA256: hex.EncodeToString(sum[:]),
			ExpiresAt: rfc3339(e.Blob.ExpiresAt), Revision: le.kv.ModRevision}, true, nil
	})
}
