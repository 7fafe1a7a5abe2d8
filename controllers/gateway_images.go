package controllers

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/distribution/reference"
)

// ImagePolicy is the set of images ReversiGateways may run (issue 17, "an image policy"):
// without it, whoever may create a ReversiGateway runs any image with the gateway's
// ServiceAccount and Secrets. It is a list of glob patterns with path.Match semantics, matched
// against the whole image string as spec.image writes it (no normalisation: "reversi:1" and
// "docker.io/library/reversi:1" are different strings): `*` matches any run of characters
// except `/`, `?` one character except `/`, `[a-z]` a class, `\` quotes the next character. So
// `ghcr.io/acme/*` allows every repository directly under ghcr.io/acme, with any tag or
// digest, and nothing deeper. An image must also parse as an image reference
// (github.com/distribution/reference). `reversi controller --gateway-images` sets it; the
// default is DefaultGatewayImages of --gateway-image. The ReversiGateway webhook refuses a
// spec.image outside it, and the reconciler refuses to render one (webhooks can be absent).
type ImagePolicy struct {
	patterns []string
}

// NewImagePolicy checks patterns (each must be a valid path.Match pattern; at least one) and
// returns the policy. Errors name the bad pattern.
func NewImagePolicy(patterns []string) (*ImagePolicy, error) {
	if len(patterns) == 0 {
		return nil, errors.New("no gateway image patterns: every ReversiGateway would be refused; give at least one (e.g. the repository of --gateway-image with :*)")
	}
	for _, p := range patterns {
		if p == "" {
			return nil, errors.New("an empty gateway image pattern matches no image")
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("gateway image pattern %q: %w (path.Match syntax: * ? [class] and \\ to quote)", p, err)
		}
	}
	return &ImagePolicy{patterns: slices.Clone(patterns)}, nil
}

// Patterns are the policy's patterns, in the order given.
func (p *ImagePolicy) Patterns() []string { return slices.Clone(p.patterns) }

// Check returns nil when image parses as an image reference and matches a pattern, else an
// *ImageNotAllowedError for field (the field or flag that set the image, for the message).
func (p *ImagePolicy) Check(field, image string) error {
	if _, err := reference.Parse(image); err != nil {
		return &ImageNotAllowedError{Field: field, Image: image, Patterns: p.Patterns(), Invalid: err}
	}
	for _, pat := range p.patterns {
		if ok, _ := path.Match(pat, image); ok { // patterns were checked by NewImagePolicy
			return nil
		}
	}
	return &ImageNotAllowedError{Field: field, Image: image, Patterns: p.Patterns()}
}

// ImageNotAllowedError is an image outside the ImagePolicy, or not an image reference at all
// (Invalid is the parse error then).
type ImageNotAllowedError struct {
	Field    string // e.g. spec.image
	Image    string
	Patterns []string
	Invalid  error
	// Upstream is set for the image of a container upstream (issue 23), checked against the
	// policy of --upstream-images.
	Upstream bool
}

func (e *ImageNotAllowedError) Error() string {
	if e.Invalid != nil {
		return fmt.Sprintf("%s %q is not a valid image reference (%v): write REPOSITORY[:TAG][@DIGEST]", e.Field, e.Image, e.Invalid)
	}
	if e.Upstream {
		return fmt.Sprintf("%s %q is not allowed: the controller runs upstream container images matching %s (reversi controller --upstream-images, by default the --gateway-images patterns): use such an image, or ask the controller's operator to allow this one",
			e.Field, e.Image, strings.Join(e.Patterns, ", "))
	}
	return fmt.Sprintf("%s %q is not allowed: the controller runs gateway images matching %s (reversi controller --gateway-images): use such an image, or ask the controller's operator to allow this one",
		e.Field, e.Image, strings.Join(e.Patterns, ", "))
}

// ImageRepository is the repository of an image reference, as written: its registry host
// (with the port, if any) and path, without tag or digest. "localhost:5000/reversi:1" is
// "localhost:5000/reversi" (the first colon is a port, not a tag), "reversi@sha256:…" is
// "reversi". Errors: image is not a valid reference (github.com/distribution/reference
// grammar: lowercase repository, a tag of at most 128 characters, a well-formed digest), or
// holds only a digest.
func ImageRepository(image string) (string, error) {
	ref, err := reference.Parse(image)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", image, err)
	}
	named, ok := ref.(reference.Named)
	if !ok {
		return "", fmt.Errorf("image %q names no repository", image)
	}
	return named.Name(), nil
}

// DefaultGatewayImages is the default of `--gateway-images`: the repository of image (the
// controller's --gateway-image, DefaultGatewayImage unless set) with no tag, any tag, or any
// sha256 digest: for "reversi:latest", [reversi reversi:* reversi@sha256:*]. Errors: those of
// ImageRepository.
func DefaultGatewayImages(image string) ([]string, error) {
	repo, err := ImageRepository(image)
	if err != nil {
		return nil, err
	}
	return []string{repo, repo + ":*", repo + "@sha256:*"}, nil
}

// ParseImagePatterns reads the values of a repeatable, comma-separated flag: each value is
// split on commas and trimmed; an empty pattern is an error.
func ParseImagePatterns(vals []string) ([]string, error) {
	var out []string
	for _, v := range vals {
		for p := range strings.SplitSeq(v, ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				return nil, fmt.Errorf("gateway image patterns %q: an empty pattern (two commas, or a trailing one)", v)
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// GatewayImagePolicy is the policy of `reversi controller --gateway-image IMAGE
// --gateway-images PATTERNS`: patterns, or DefaultGatewayImages(image) when there are none;
// image "" is DefaultGatewayImage. The policy must allow image, which gateways without
// spec.image run. Errors: an invalid image or pattern, or patterns that refuse image.
func GatewayImagePolicy(image string, patterns []string) (*ImagePolicy, error) {
	if image == "" {
		image = DefaultGatewayImage
	}
	if len(patterns) == 0 {
		var err error
		if patterns, err = DefaultGatewayImages(image); err != nil {
			return nil, fmt.Errorf("--gateway-image: %w", err)
		}
	}
	p, err := NewImagePolicy(patterns)
	if err != nil {
		return nil, fmt.Errorf("--gateway-images: %w", err)
	}
	if err := p.Check("--gateway-image", image); err != nil {
		return nil, fmt.Errorf("%w: gateways without spec.image run it, so --gateway-images must allow it", err)
	}
	return p, nil
}
