package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestFromFlags(t *testing.T) {
	g, err := FromFlags(Flags{UpstreamCmd: "npx", UpstreamArgs: []string{"-y", "${NOT_EXPANDED}"}})
	if err != nil {
		t.Fatal(err)
	}
	want := Upstream{Name: FlagUpstreamName, Command: "npx", Args: []string{"-y", "${NOT_EXPANDED}"}}
	if len(g.Upstreams) != 1 || !reflect.DeepEqual(g.Upstreams[0], want) || g.Mode != ModeAuto || g.Actor != DefaultActor ||
		!g.ValidateSchemas || g.UnclassifiedReads != UnclassifiedBlock || g.Listen != nil || g.File != "" {
		t.Fatalf("%+v", g)
	}
	g, err = FromFlags(Flags{UpstreamURL: "https://mcp.example.com/mcp", Mode: "advise", Actor: "ci"})
	if err != nil || g.Upstreams[0].URL != "https://mcp.example.com/mcp" || g.Upstreams[0].Stdio() || g.Mode != ModeAdvise || g.Actor != "ci" {
		t.Fatalf("%+v %v", g, err)
	}
	for _, c := range []struct {
		f    Flags
		want string
	}{
		{Flags{}, "no upstream: give --upstream-cmd"},
		{Flags{UpstreamArgs: []string{"x"}}, "--upstream-arg needs --upstream-cmd"},
		{Flags{UpstreamCmd: "a", UpstreamURL: "https://x"}, "not both"},
		{Flags{UpstreamURL: "https://x", UpstreamArgs: []string{"x"}}, "--upstream-arg applies to --upstream-cmd"},
		{Flags{UpstreamURL: "x.example.com"}, `--upstream-url: "x.example.com" is not an http or https URL`},
		{Flags{UpstreamCmd: "a", Mode: "strict"}, `--mode "strict": use enforce, advise or observe`},
		{Flags{UpstreamCmd: "a", Console: "open"}, "console open needs HTTP mode"},
		{Flags{UpstreamCmd: "a", Console: "maybe"}, `--console "maybe"`},
	} {
		if _, err := FromFlags(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want %q", c.f, err, c.want)
		}
	}
}

func TestMergeExplicitFlagsOverrideTheFile(t *testing.T) {
	file, errs := Parse("gw.yaml", []byte(up+"mode: enforce\nactor: file-actor\nlisten: {port: 7431}\nauth: {keys: k.json}\nconsole: {mode: login}\n"), nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	same, err := Merge(file, Flags{})
	if err != nil || !reflect.DeepEqual(same, file) {
		t.Fatalf("no flags must change nothing: %+v %v", same, err)
	}
	g, err := Merge(file, Flags{Mode: "observe", Actor: "flag-actor", Console: "open", ConsoleRole: "auditor"})
	if err != nil {
		t.Fatal(err)
	}
	if g.Mode != ModeObserve || g.Actor != "flag-actor" || g.Console != (Console{Mode: "open", Role: "auditor"}) {
		t.Fatalf("%+v", g)
	}
	if file.Mode != ModeEnforce || file.Actor != "file-actor" || file.Console.Mode != "login" {
		t.Fatalf("Merge changed the file's config: %+v", file)
	}
	g, err = Merge(file, Flags{Console: "open"})
	if err != nil || g.Console.Role != DefaultConsoleRole {
		t.Fatalf("--console open takes the default role: %+v %v", g, err)
	}
	for _, c := range []struct {
		f    Flags
		want string
	}{
		{Flags{UpstreamCmd: "npx"}, "add the upstream to upstreams: in gw.yaml"},
		{Flags{UpstreamURL: "https://x"}, "for running without a config file"},
		{Flags{ConsoleRole: "auditor"}, "--console-role applies to --console open only"},
		{Flags{Console: "open", ConsoleRole: "admin"}, "refuses to start an open console with the admin role"},
		{Flags{Console: "open", ConsoleRole: "owner"}, `--console-role "owner"`},
		{Flags{Mode: "block"}, `--mode "block"`},
	} {
		if _, err := Merge(file, c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want %q", c.f, err, c.want)
		}
	}
	noAuth, errs := Parse("gw.yaml", []byte(up+"listen: {port: 7431}\n"), nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if _, err := Merge(noAuth, Flags{Console: "login"}); err == nil || !strings.Contains(err.Error(), "console login needs auth.keys or auth.oidc") {
		t.Fatalf("login without auth: %v", err)
	}
}
