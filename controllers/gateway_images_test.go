package controllers

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

const digest64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Issue 17: the repository of an image reference, as written: a registry port is not a tag,
// a digest or tag is dropped; what is not a reference is an error.
func TestImageRepository(t *testing.T) {
	for in, want := range map[string]string{
		"reversi:latest":                             "reversi",
		"reversi":                                    "reversi",
		"reversi@sha256:" + digest64:                 "reversi",
		"localhost:5000/reversi:1":                   "localhost:5000/reversi",
		"localhost:5000/reversi":                     "localhost:5000/reversi",
		"ghcr.io/acme/reversi:v1@sha256:" + digest64: "ghcr.io/acme/reversi",
		"reversi:5000":                               "reversi", // a tag that looks like a port
	} {
		if got, err := ImageRepository(in); err != nil || got != want {
			t.Errorf("ImageRepository(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Reversi:1", "reversi:a b", "reversi@sha256:short", "reversi:" + strings.Repeat("t", 129)} {
		if got, err := ImageRepository(in); err == nil {
			t.Errorf("ImageRepository(%q) = %q, want an error", in, got)
		}
	}
}

// The default of --gateway-images: the default image's repository with no tag, any tag or any
// digest, for a registry with a port too.
func TestDefaultGatewayImages(t *testing.T) {
	for in, want := range map[string][]string{
		DefaultGatewayImage:                       {"reversi", "reversi:*", "reversi@sha256:*"},
		"localhost:5000/team/reversi:1":           {"localhost:5000/team/reversi", "localhost:5000/team/reversi:*", "localhost:5000/team/reversi@sha256:*"},
		"ghcr.io/acme/reversi@sha256:" + digest64: {"ghcr.io/acme/reversi", "ghcr.io/acme/reversi:*", "ghcr.io/acme/reversi@sha256:*"},
	} {
		if got, err := DefaultGatewayImages(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("DefaultGatewayImages(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := DefaultGatewayImages("Not/An:Image:"); err == nil {
		t.Error("an invalid default image gave patterns")
	}
}

// What the default policy allows and refuses: the same repository with any tag or digest;
// another repository, a registry in front of the name, a path under it, a repository whose
// name starts the same, and a string that is no reference are refused, each naming the image
// and the patterns.
func TestImagePolicyDefault(t *testing.T) {
	p, err := GatewayImagePolicy("", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{"reversi", "reversi:latest", "reversi:v1.2.3", "reversi@sha256:" + digest64, "reversi:v1@sha256:" + digest64} {
		if err := p.Check("spec.image", img); err != nil {
			t.Errorf("%q refused: %v", img, err)
		}
	}
	for _, img := range []string{"attacker.example/exfil:1", "attacker.example/reversi:latest", "reversi/exfil:1", "reversi-evil:1",
		"reversi:5000/exfil:1", "docker.io/library/reversi:latest", "reversi:a b", "reversi@md5:abc"} {
		err := p.Check("spec.image", img)
		var ie *ImageNotAllowedError
		if !errors.As(err, &ie) || ie.Image != img {
			t.Errorf("%q: %v, want an ImageNotAllowedError", img, err)
			continue
		}
		if ie.Invalid == nil && !strings.Contains(err.Error(), `spec.image "`+img+`" is not allowed: the controller runs gateway images matching reversi, reversi:*, reversi@sha256:* (reversi controller --gateway-images)`) {
			t.Errorf("%q: %v", img, err)
		}
	}
}

// Patterns given with the flag: path.Match (a `*` stops at `/`), comma-separated and
// repeatable; a bad or empty pattern, or a list that refuses the default image, is an error.
func TestImagePolicyFlag(t *testing.T) {
	pats, err := ParseImagePatterns([]string{"ghcr.io/acme/*, localhost:5000/reversi:*", "reversi:latest"})
	if err != nil || !slices.Equal(pats, []string{"ghcr.io/acme/*", "localhost:5000/reversi:*", "reversi:latest"}) {
		t.Fatalf("%q %v", pats, err)
	}
	p, err := GatewayImagePolicy("", pats)
	if err != nil {
		t.Fatal(err)
	}
	for img, ok := range map[string]bool{
		"ghcr.io/acme/gw:1": true, "ghcr.io/acme/gw@sha256:" + digest64: true, "ghcr.io/acme/deeper/gw:1": false,
		"localhost:5000/reversi:2": true, "localhost:5001/reversi:2": false, "reversi:latest": true, "reversi:1": false,
	} {
		if err := p.Check("spec.image", img); (err == nil) != ok {
			t.Errorf("%q: %v, want allowed=%v", img, err, ok)
		}
	}
	for _, bad := range [][]string{{"a,,b"}, {"a,"}, {" "}} {
		if _, err := ParseImagePatterns(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := GatewayImagePolicy("", []string{"reversi:[1"}); err == nil || !strings.Contains(err.Error(), `"reversi:[1"`) {
		t.Errorf("a bad pattern: %v", err)
	}
	if _, err := GatewayImagePolicy("reversi:1", []string{"ghcr.io/acme/*"}); err == nil ||
		!strings.Contains(err.Error(), `--gateway-image "reversi:1" is not allowed`) {
		t.Errorf("patterns that refuse the default image: %v", err)
	}
	if p, err := GatewayImagePolicy("localhost:5000/reversi:1", nil); err != nil || !slices.Equal(p.Patterns(), []string{"localhost:5000/reversi", "localhost:5000/reversi:*", "localhost:5000/reversi@sha256:*"}) {
		t.Errorf("the default of another default image: %v %v", p, err)
	}
}
