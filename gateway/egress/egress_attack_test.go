package egress

import (
	"net/netip"
	"strings"
	"testing"
)

// TestAttackDialedIPv6Forms: the address a connection dials, in the IPv6 forms that reach an
// IPv4 address. IPv4-mapped (::ffff:a.b.c.d) is the IPv4 address; a NAT64 address
// (64:ff9b::/96, RFC 6052; 64:ff9b:1::/48, RFC 8215) is translated by the network's NAT64
// gateway to the IPv4 address in its last 32 bits, so 64:ff9b::a9fe:a9fe reached
// 169.254.169.254 and 64:ff9b::a00:7 reached 10.0.0.7 under block_private.
func TestAttackDialedIPv6Forms(t *testing.T) {
	for _, c := range []struct {
		addr, want string
		block      bool
	}{
		{"::ffff:169.254.169.254", "metadata", false},
		{"64:ff9b::a9fe:a9fe", "metadata", false},
		{"64:ff9b::169.254.169.254", "metadata", false},
		{"64:ff9b:1::a9fe:a9fe", "metadata", false},
		{"64:ff9b::a00:7", "private", true},
		{"64:ff9b::7f00:1", "private", true},
		{"0.0.0.0", "private", true},
		{"::", "private", true},
		{"::ffff:10.0.0.7", "private", true},
	} {
		err := Rules{BlockPrivate: c.block}.Dialed(netip.MustParseAddr(c.addr))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s (block_private %v): %v, want %s", c.addr, c.block, err, c.want)
		}
		if err := Check(t.Context(), "http://["+c.addr+"]/", Rules{BlockPrivate: c.block}, nil); err == nil {
			t.Errorf("Check %s (block_private %v) passed", c.addr, c.block)
		}
	}
	// The honest path: a NAT64 address of a public IPv4 address passes under block_private.
	if err := (Rules{BlockPrivate: true}).Dialed(netip.MustParseAddr("64:ff9b::808:808")); err != nil {
		t.Errorf("64:ff9b::808:808: %v", err)
	}
}
