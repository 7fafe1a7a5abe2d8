// Package dialguard checks the address a connection is about to be made to, after the dialer
// resolved the name: a check of an earlier lookup of the name can be passed by a name that
// answers an allowed address to the check and a refused one to the dial (DNS rebinding).
package dialguard

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// Dialer returns a net.Dialer (connect timeout: timeout) that shows allow every address it is
// about to connect to, IPv4-mapped IPv6 unmapped; a non-nil error from allow refuses that
// connection, and the dial fails with it. allow nil: every address is allowed.
func Dialer(timeout time.Duration, allow func(netip.Addr) error) *net.Dialer {
	d := &net.Dialer{Timeout: timeout}
	if allow != nil {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("connecting to %s: not an address", address)
			}
			return allow(ap.Addr().Unmap())
		}
	}
	return d
}
