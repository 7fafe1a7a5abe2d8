package webhook

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestAttackURLInErrors (issue 24, red team): a Slack URL is the secret of its channel, and a
// failed attempt's error is logged and stored (`reversi notifications list` shows it). The
// error of a transport failure names the URL as net/http re-encoded it, which is not the
// configured text when the scheme has capitals, the URL has a password (shown as ***, the
// rest of it in clear), or the path is re-escaped: the replacement of the configured text
// missed it. No form of the secret path may appear.
func TestAttackURLInErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens: every attempt is a transport error
	const token = "T0SECRET/B0SECRET/XoXoSecretPath"
	for _, u := range []string{
		"HTTPS://" + addr + "/services/" + token,
		"http://" + addr + "/services/" + token,
		"http://user:pw@" + addr + "/services/" + token,
		"http://" + addr + "/services/" + token + "/%7e",
		"http://" + addr + "/services/" + token + "?a=b c",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := Post(ctx, NewClient(time.Second, 1), Delivery{URL: u, Event: "e", Key: "k", Body: []byte(`{}`)}, 0)
		cancel()
		if err == nil {
			t.Fatalf("%s: delivered", u)
		}
		if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: the error carries the URL: %v", u, err)
		}
		if !strings.Contains(err.Error(), "<receiver url>") && !strings.Contains(err.Error(), "request:") {
			t.Errorf("%s: %v", u, err)
		}
	}
}
