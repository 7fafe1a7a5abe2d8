package v1alpha1

import "fmt"

// GatewaySecretRef is one reference of a ReversiGatewaySpec (or ManifestRegistrySpec) to a
// Secret of the object's namespace: the Secret's name and the field that names it, as a path
// in the object's JSON (e.g. spec.upstreams[0].headers[1].secretKeyRef).
//
// +kubebuilder:object:generate=false
type GatewaySecretRef struct {
	// Name of the Secret.
	Name string
	// Field is the JSON path of the reference, from spec.
	Field string
}

// SecretRefs lists every Secret the spec references, one entry per referencing field, in the
// order of the spec's fields (a Secret named by several fields appears once per field):
//
//   - spec.upstreams[i].headers[j].secretKeyRef (header values of url upstreams)
//   - spec.upstreams[i].env[j].secretKeyRef (environment of command upstreams)
//   - spec.upstreams[i].container.env[j].valueFrom.secretKeyRef and
//     spec.upstreams[i].container.volumes[j].secret (a container upstream's sidecar)
//   - spec.trustedKeysSecretRef (the gateway's trusted Ed25519 keys)
//   - spec.store.postgres.urlSecretRef (the postgres store's URL)
//   - spec.auth.keysSecretRef (the API key file)
//   - spec.notifications[i].urlSecretRef and spec.notifications[i].secretRef (a notification
//     receiver's URL and HMAC key)
//
// Every one of them ends up in the gateway's pod (an env var from a secretKeyRef, a Secret
// volume) or in its Role (get on the trusted-keys Secret), so whoever writes the spec reads
// these Secrets through the gateway. ReversiGateway admission (issue 17) checks that the
// author may get each one; a test walks the spec's types by reflection so that a new field of
// a Secret-reference type cannot be left out of this list. A reference with an empty name is
// listed too (the CRD refuses it; admission checks what it is given).
func (s *ReversiGatewaySpec) SecretRefs() []GatewaySecretRef {
	var out []GatewaySecretRef
	add := func(name, field string) { out = append(out, GatewaySecretRef{Name: name, Field: field}) }
	for i, u := range s.Upstreams {
		for j, h := range u.Headers {
			if h.SecretKeyRef != nil {
				add(h.SecretKeyRef.Name, fmt.Sprintf("spec.upstreams[%d].headers[%d].secretKeyRef", i, j))
			}
		}
		for j, e := range u.Env {
			if e.SecretKeyRef != nil {
				add(e.SecretKeyRef.Name, fmt.Sprintf("spec.upstreams[%d].env[%d].secretKeyRef", i, j))
			}
		}
		if c := u.Container; c != nil {
			for j, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					add(e.ValueFrom.SecretKeyRef.Name, fmt.Sprintf("spec.upstreams[%d].container.env[%d].valueFrom.secretKeyRef", i, j))
				}
			}
			for j, v := range c.Volumes {
				if v.Secret != nil {
					add(v.Secret.Name, fmt.Sprintf("spec.upstreams[%d].container.volumes[%d].secret", i, j))
				}
			}
		}
	}
	if s.TrustedKeysSecretRef != nil {
		add(s.TrustedKeysSecretRef.Name, "spec.trustedKeysSecretRef")
	}
	if s.Store != nil && s.Store.Postgres != nil {
		add(s.Store.Postgres.URLSecretRef.Name, "spec.store.postgres.urlSecretRef")
	}
	if s.Auth != nil && s.Auth.KeysSecretRef != nil {
		add(s.Auth.KeysSecretRef.Name, "spec.auth.keysSecretRef")
	}
	for i, n := range s.Notifications {
		add(n.URLSecretRef.Name, fmt.Sprintf("spec.notifications[%d].urlSecretRef", i))
		if n.SecretRef != nil {
			add(n.SecretRef.Name, fmt.Sprintf("spec.notifications[%d].secretRef", i))
		}
	}
	return out
}

// SecretRefs lists every Secret the spec references, one entry per referencing field, in the
// order of the spec's fields:
//
//   - spec.secretRef (git credentials: the controller sends username and password, or
//     bearerToken, to spec.url)
//   - spec.verify.manifestKeysSecretRef (the writers' Ed25519 public keys)
//   - spec.verify.commit.secretRef (the committers' SSH and OpenPGP keys)
//
// The controller reads them with its own rights, so whoever writes the spec would read them
// through it (the credentials go to a server of their choosing): ManifestRegistry admission
// (issue 17) checks that the author may get each one. A test walks the spec's types by
// reflection, as for ReversiGatewaySpec.SecretRefs.
func (s *ManifestRegistrySpec) SecretRefs() []GatewaySecretRef {
	var out []GatewaySecretRef
	if s.SecretRef != nil {
		out = append(out, GatewaySecretRef{Name: s.SecretRef.Name, Field: "spec.secretRef"})
	}
	if v := s.Verify; v != nil {
		if v.ManifestKeysSecretRef != nil {
			out = append(out, GatewaySecretRef{Name: v.ManifestKeysSecretRef.Name, Field: "spec.verify.manifestKeysSecretRef"})
		}
		if v.Commit != nil {
			out = append(out, GatewaySecretRef{Name: v.Commit.SecretRef.Name, Field: "spec.verify.commit.secretRef"})
		}
	}
	return out
}
