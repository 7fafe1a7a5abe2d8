package egress

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// rebind resolves every name to one address: a name pointing at a metadata address cannot be
// produced on demand by the system resolver.
type rebind netip.Addr

func (r rebind) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.Addr(r)}, nil
}

func TestCheck(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url   string
		rules Rules
		r     Resolver
		want  string // "" allowed
	}{
		{"http://169.254.169.254/latest/meta-data", Rules{}, nil, "169.254.169.254 is a cloud metadata address, which is always refused"},
		{"http://[fd00:ec2::254]/", Rules{}, nil, "fd00:ec2::254 is a cloud metadata address"},
		{"http://metadata.google.internal/computeMetadata/v1", Rules{}, nil, "metadata.google.internal is a cloud metadata endpoint"},
		{"http://innocent.example/mcp", Rules{}, rebind(netip.MustParseAddr("169.254.169.254")), "host innocent.example resolves to 169.254.169.254, which is a cloud metadata address"},
		{"http://[::ffff:169.254.169.254]/", Rules{}, nil, "cloud metadata address"},
		{"http://127.0.0.1:7000/mcp", Rules{}, nil, ""},
		{"http://127.0.0.1:7000/mcp", Rules{BlockPrivate: true}, nil, "127.0.0.1 is a private address and egress.block_private is set"},
		{"http://localhost:7000/mcp", Rules{BlockPrivate: true}, nil, "host localhost resolves to"},
		{"http://10.1.2.3/mcp", Rules{BlockPrivate: true}, nil, "private address"},
		{"http://100.64.0.9/mcp", Rules{BlockPrivate: true}, nil, "private address"},
		{"http://mcp.example.com/mcp", Rules{BlockPrivate: true}, rebind(netip.MustParseAddr("93.184.215.14")), ""},
		{"https://mcp.example.com/mcp", Rules{AllowedHosts: []string{"*.example.com"}}, rebind(netip.MustParseAddr("93.184.215.14")), ""},
		{"https://api.mcp.example.com/mcp", Rules{AllowedHosts: []string{"*.example.com"}}, rebind(netip.MustParseAddr("93.184.215.14")), ""},
		{"https://example.com.evil.test/mcp", Rules{AllowedHosts: []string{"*.example.com", "github.com"}}, nil, "host example.com.evil.test is not in egress.allowed_hosts (*.example.com, github.com)"},
		{"https://GitHub.com./mcp", Rules{AllowedHosts: []string{"github.com"}}, rebind(netip.MustParseAddr("140.82.112.3")), ""},
		{"mcp", Rules{}, nil, "is not a URL with a host"},
	} {
		err := Check(ctx, tc.url, tc.rules, tc.r)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %+v: %v, want allowed", tc.url, tc.rules, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %+v: %v, want %q", tc.url, tc.rules, err, tc.want)
		}
	}
}
