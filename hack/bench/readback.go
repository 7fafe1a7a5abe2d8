package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// checkJournal reads the SQLite journal in data back and checks that it holds exactly want
// calls of read_graph, each an allowed intent followed by a succeeded outcome.
func checkJournal(ctx context.Context, data string, want int) error {
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	return countJournal(ctx, st, st.Path(), want)
}

// checkJournalPostgres is checkJournal for a PostgreSQL database.
func checkJournalPostgres(ctx context.Context, url string, want int) error {
	st, err := store.OpenPostgres(ctx, url, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	return countJournal(ctx, st, "PostgreSQL", want)
}

// countJournal checks that st holds exactly want calls of read_graph, each an allowed intent
// followed by a succeeded outcome; where names the journal in errors.
func countJournal(ctx context.Context, st store.Store, where string, want int) error {
	runs, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		return err
	}
	intents, outcomes := 0, 0
	for _, r := range runs {
		recs, err := st.Records(ctx, r.ID, 0, 0)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			if rec.Tool != gatewayTool {
				continue
			}
			switch {
			case rec.Kind == store.KindIntent && rec.Decision == "allow" && rec.ManifestChecksum != "":
				intents++
			case rec.Kind == store.KindOutcome && rec.Status == store.Succeeded:
				outcomes++
			default:
				return fmt.Errorf("journal %s: unexpected record %+v", where, rec)
			}
		}
	}
	if intents != want || outcomes != want {
		return fmt.Errorf("journal %s: %d allowed intents and %d succeeded outcomes of %s, want %d of each",
			where, intents, outcomes, gatewayTool, want)
	}
	return nil
}

// checkRunsLive is the read-back of gateways whose journal dies with them (the memory store):
// on every session it asks the gateway itself (reversi.list_runs, then reversi.get_run of each
// run) and checks that the sessions' runs hold exactly want steps of read_graph in all, each
// allowed and succeeded.
func checkRunsLive(ctx context.Context, sessions []*mcp.ClientSession, want int) error {
	steps := 0
	for i, cs := range sessions {
		var list struct {
			Runs []struct {
				ID string `json:"id"`
			} `json:"runs"`
		}
		if err := callJSON(ctx, cs, "reversi.list_runs", map[string]any{"limit": 200}, &list); err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		for _, r := range list.Runs {
			var run struct {
				Steps []struct {
					Tool     string `json:"tool"`
					Decision string `json:"decision"`
					Status   string `json:"status"`
				} `json:"steps"`
			}
			if err := callJSON(ctx, cs, "reversi.get_run", map[string]any{"run": r.ID}, &run); err != nil {
				return fmt.Errorf("session %d: %w", i, err)
			}
			for _, s := range run.Steps {
				if s.Tool != gatewayTool {
					continue
				}
				if s.Decision != "allow" || s.Status != string(store.Succeeded) {
					return fmt.Errorf("session %d, run %s: a step of %s is %s/%s, want allow/%s", i, r.ID, gatewayTool, s.Decision, s.Status, store.Succeeded)
				}
				steps++
			}
		}
	}
	if steps != want {
		return fmt.Errorf("the gateways' runs (reversi.get_run) hold %d steps of %s, want %d", steps, gatewayTool, want)
	}
	return nil
}

// callJSON calls tool on cs and decodes its structured content into out.
func callJSON(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any, out any) error {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	if res.IsError {
		return fmt.Errorf("%s: isError: %s", tool, resultText(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s: structured content: %w", tool, err)
	}
	return nil
}
