package auth_test

import (
	"encoding/json"

	"github.com/reversi-gitops/reversi/gateway/auth"
)

func jsonKeys(keys ...auth.KeyEntry) ([]byte, error) { return json.Marshal(auth.KeyFile{Keys: keys}) }
