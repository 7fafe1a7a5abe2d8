package sourcetest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Signer makes git sign commits and tags.
type Signer interface {
	// GitArgs are the `-c name=value` options that make git sign with the key.
	GitArgs() []string
	// Env is extra environment git needs to sign (GNUPGHOME for OpenPGP).
	Env() []string
}

// SSHKey is an unencrypted ed25519 key pair made by ssh-keygen.
type SSHKey struct {
	// PrivateKeyPath is the private key file (mode 0600); PublicKeyPath is PrivateKeyPath+".pub".
	PrivateKeyPath, PublicKeyPath string
	// PrivateKey is the private key file's content (OpenSSH PEM), usable as a git identity.
	PrivateKey []byte
	// AuthorizedKey is the public key line ("ssh-ed25519 AAAA... comment\n"): what a
	// `*.sshpub` verification entry or an authorized_keys file holds.
	AuthorizedKey []byte
	Public        ssh.PublicKey
	// Fingerprint is "SHA256:...".
	Fingerprint string
}

// NewSSHKey makes an ed25519 key with ssh-keygen in a temporary directory.
func NewSSHKey(t testing.TB) *SSHKey {
	t.Helper()
	RequireTools(t, "ssh-keygen")
	path := filepath.Join(t.TempDir(), "id_ed25519")
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "reversi-test", "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	k := &SSHKey{PrivateKeyPath: path, PublicKeyPath: path + ".pub"}
	if k.PrivateKey, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	if k.AuthorizedKey, err = os.ReadFile(k.PublicKeyPath); err != nil {
		t.Fatal(err)
	}
	if k.Public, _, _, _, err = ssh.ParseAuthorizedKey(k.AuthorizedKey); err != nil {
		t.Fatal(err)
	}
	k.Fingerprint = ssh.FingerprintSHA256(k.Public)
	return k
}

// GitArgs signs with gpg.format=ssh and this key (git runs `ssh-keygen -Y sign -n git`).
func (k *SSHKey) GitArgs() []string {
	return []string{"-c", "gpg.format=ssh", "-c", "user.signingkey=" + k.PrivateKeyPath}
}

// Env is empty for SSH keys.
func (k *SSHKey) Env() []string { return nil }

// GPGKey is an OpenPGP ed25519 signing key in a throwaway GNUPGHOME.
type GPGKey struct {
	Home string
	// Fingerprint is the primary key's fingerprint, upper-case hex.
	Fingerprint string
	// ArmoredPublicKey is `gpg --armor --export`: what a `*.asc` verification entry holds.
	ArmoredPublicKey []byte
}

// NewGPGKey makes a key with gpg in batch mode (no passphrase). It skips the test when gpg
// is not installed. The agent it starts is stopped when the test ends.
func NewGPGKey(t testing.TB, uid string) *GPGKey {
	t.Helper()
	if _, err := exec.LookPath("gpg"); err != nil {
		t.Skip("gpg is not installed (apt-get install gnupg); skipping OpenPGP signing")
	}
	// A short path: the agent's socket lives in GNUPGHOME and socket paths are limited.
	home, err := os.MkdirTemp("", "gpg")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(home, 0o700); err != nil {
		t.Fatal(err)
	}
	k := &GPGKey{Home: home}
	t.Cleanup(func() {
		kill := exec.Command("gpgconf", "--kill", "gpg-agent")
		kill.Env = k.Env()
		_ = kill.Run()
		_ = os.RemoveAll(home)
	})
	k.gpg(t, "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
	for _, line := range strings.Split(k.gpg(t, "--batch", "--with-colons", "--list-keys", uid), "\n") {
		if f := strings.Split(line, ":"); len(f) > 9 && f[0] == "fpr" {
			k.Fingerprint = strings.ToUpper(f[9])
			break
		}
	}
	if k.Fingerprint == "" {
		t.Fatal("gpg: no fingerprint for the new key")
	}
	k.ArmoredPublicKey = []byte(k.gpg(t, "--batch", "--armor", "--export", k.Fingerprint))
	return k
}

func (k *GPGKey) gpg(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command("gpg", args...)
	cmd.Env = append(os.Environ(), k.Env()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("gpg %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// GitArgs signs with gpg.format=openpgp and this key.
func (k *GPGKey) GitArgs() []string {
	return []string{"-c", "gpg.format=openpgp", "-c", "user.signingkey=" + k.Fingerprint}
}

// Env points gpg at the key's GNUPGHOME.
func (k *GPGKey) Env() []string { return []string{"GNUPGHOME=" + k.Home} }
