package controllers

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/pkg/signing"
)

// The controller's signing key: the Secret that holds it and the ConfigMap that publishes its
// public keys, both in the controller's namespace (`reversi controller --signing-key-secret`).
const (
	DefaultSigningKeySecret = "reversi-controller-signing-key"
	// SigningKeyData is the Secret key of the current private key (PKCS#8 PEM). Other keys
	// ending in ".pub" are earlier public keys that gateways keep trusting during a rotation.
	SigningKeyData = "signing.key"
	// PublicKeysConfigMap publishes the public keys (data PublicKeysData, PEM) for gateways that
	// run outside the cluster and for people checking a rendering by hand.
	PublicKeysConfigMap = "reversi-controller-keys"
	PublicKeysData      = "keys.pem"
	// ControllerKeysEnv carries the public keys (PEM) into every gateway pod: the gateway's
	// `--kube-controller-keys` default.
	ControllerKeysEnv = "REVERSI_CONTROLLER_KEYS"
)

// SigningKey is the controller's own Ed25519 key: it signs the snapshot of every rendering
// (pkg/bundle), so that gateways accept only sets the controller verified, in order.
type SigningKey struct {
	Signer *signing.Signer
	// PublicPEM holds the current public key and the earlier ones still trusted, PEM.
	PublicPEM []byte
	// Trust is PublicPEM parsed: what the controller itself verifies renderings with.
	Trust *signing.TrustSet
}

// NewSigningKey builds a SigningKey from a private key (PKCS#8 PEM) and earlier public keys.
func NewSigningKey(privPEM []byte, earlier ...[]byte) (*SigningKey, error) {
	s, err := signing.ParseSigner(privPEM)
	if err != nil {
		return nil, err
	}
	pub, err := s.PublicKeyPEM()
	if err != nil {
		return nil, err
	}
	all := append([][]byte{pub}, earlier...)
	pemBundle := bytes.Join(all, []byte("\n"))
	trust, err := signing.ParseTrustSet(pemBundle)
	if err != nil {
		return nil, fmt.Errorf("earlier public keys: %w", err)
	}
	return &SigningKey{Signer: s, PublicPEM: pemBundle, Trust: trust}, nil
}

// EphemeralSigningKey is a new key kept in memory only: for tests that run the reconcilers in
// their own process (a restart makes every rendering's signature new).
func EphemeralSigningKey() (*SigningKey, error) {
	priv, _, err := signing.GenerateKey()
	if err != nil {
		return nil, err
	}
	return NewSigningKey(priv)
}

// EnsureSigningKey reads the controller's signing key from the Secret ref, creating the Secret
// with a new key when it does not exist (first start; a concurrent creator wins and its key is
// read), and publishes the public keys in the ConfigMap PublicKeysConfigMap of ref's namespace.
// Use a client that reads the API server directly (the manager's cache is not started yet).
// Errors: the Secret cannot be read or created (RBAC: get and create on that Secret), or
// holds no usable key (an error naming the Secret and what to put in it).
func EnsureSigningKey(ctx context.Context, c client.Client, ref types.NamespacedName) (*SigningKey, error) {
	var s corev1.Secret
	err := c.Get(ctx, ref, &s)
	if apierrors.IsNotFound(err) {
		priv, _, gerr := signing.GenerateKey()
		if gerr != nil {
			return nil, gerr
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{SigningKeyData: priv},
		}
		err = c.Create(ctx, &s)
		if apierrors.IsAlreadyExists(err) {
			err = c.Get(ctx, ref, &s)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the controller's signing key Secret %s: %w", ref, err)
	}
	var earlier [][]byte
	names := make([]string, 0, len(s.Data))
	for k := range s.Data {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if strings.HasSuffix(k, ".pub") {
			earlier = append(earlier, s.Data[k])
		}
	}
	key, err := NewSigningKey(s.Data[SigningKeyData], earlier...)
	if err != nil {
		return nil, fmt.Errorf("the controller's signing key Secret %s: %w: put a PKCS#8 PEM Ed25519 key (reversi keygen) in %q, or delete the Secret to get a new key", ref, err, SigningKeyData)
	}
	if err := publishKeys(ctx, c, ref.Namespace, key.PublicPEM); err != nil {
		return nil, err
	}
	return key, nil
}

// publishKeys writes the public keys into PublicKeysConfigMap (created or updated).
func publishKeys(ctx context.Context, c client.Client, ns string, pemBundle []byte) error {
	cm := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: PublicKeysConfigMap, Labels: map[string]string{LabelManagedBy: ManagedBy}},
		Data: map[string]string{PublicKeysData: string(pemBundle)}}
	err := c.Create(ctx, &cm)
	if apierrors.IsAlreadyExists(err) {
		var cur corev1.ConfigMap
		if err = c.Get(ctx, client.ObjectKeyFromObject(&cm), &cur); err == nil && cur.Data[PublicKeysData] != string(pemBundle) {
			cur.Data = cm.Data
			err = c.Update(ctx, &cur)
		}
	}
	if err != nil {
		return fmt.Errorf("publishing the controller's public keys in ConfigMap %s/%s: %w", ns, PublicKeysConfigMap, err)
	}
	return nil
}
