// Package schemas holds the JSON Schemas of the project's file formats, embedded so that
// binaries (the gateway's reversi.validate_manifest, the CLI) serve the same bytes as the repo.
package schemas

import _ "embed"

// ManifestSchema is the JSON Schema (draft 2020-12) of one tool manifest as users write it.
// api/manifest's tests keep it in step with the Go validator.
//
//go:embed manifest.schema.json
var ManifestSchema []byte

// PolicySchema is the JSON Schema (draft 2020-12) of one policy as users write it.
// api/policy's tests keep it in step with the Go decoder.
//
//go:embed policy.schema.json
var PolicySchema []byte
