//! Codex: `codex exec --json`. Its session is a thread, named by its
//! `thread.started` line and resumed with `exec resume <id>`; no person can
//! take it over. Usage comes from each `turn.completed`.

use cairn_events::OutputStream;
use serde_json::Value;

use super::{Call, Cli, Heard};
use crate::agent::cut;
use crate::node::NodeError;

/// The `codex` engine.
pub(super) struct Codex;

impl Cli for Codex {
    fn name(&self) -> &'static str {
        "codex"
    }

    fn program(&self) -> &'static str {
        "codex"
    }

    fn args(&self, call: &Call<'_>) -> Result<Vec<String>, NodeError> {
        let mut argv = vec!["exec".to_string()];
        if let Some(s) = call.session {
            argv.extend(["resume".into(), s.to_string()]);
        }
        // The sandbox root need not be a git repository.
        argv.extend(["--json".into(), "--skip-git-repo-check".into()]);
        if let Some(m) = call.model {
            argv.push(format!("--model={}", m.model));
            // Codex reads its provider's address from its config, not from
            // the environment: a provider of Cairn's, given inline.
            if let Some(url) = &m.base_url {
                if url.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
                    return Err(NodeError::fatal(
                        "config",
                        format!(
                            "model `{}`: base_url holds a quote, a backslash or a control character",
                            m.model
                        ),
                    ));
                }
                argv.extend([
                    "-c".into(),
                    format!(
                        "model_providers.cairn={{name=\"cairn\",base_url=\"{url}\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\"}}"
                    ),
                    "-c".into(),
                    "model_provider=cairn".into(),
                ]);
            }
        }
        // After `--`, the prompt is neither an option nor a subcommand
        // (`resume`, `review`).
        argv.push("--".into());
        argv.push(match call.system {
            Some(s) => format!("{s}\n\n{}", call.prompt),
            None => call.prompt.to_string(),
        });
        Ok(argv)
    }

    fn provider_vars(&self) -> (&'static str, &'static str) {
        ("OPENAI_API_KEY", "OPENAI_BASE_URL")
    }

    fn session_in<'v>(&self, event: &'v Value) -> Option<&'v str> {
        if event["type"] == "thread.started" {
            event["thread_id"].as_str()
        } else {
            None
        }
    }

    fn hear(&self, ev: &Value, heard: &mut Vec<Heard>) {
        match ev["type"].as_str() {
            Some("item.completed") => {
                let item = &ev["item"];
                match item["type"].as_str() {
                    Some("agent_message") => {
                        if let Some(t) = item["text"].as_str() {
                            heard.push(Heard::Output(OutputStream::Text, format!("{t}\n")));
                            heard.push(Heard::Final(t.to_string()));
                        }
                    }
                    Some("reasoning") => {
                        if let Some(t) = item["text"].as_str() {
                            heard.push(Heard::Output(OutputStream::Reasoning, format!("{t}\n")));
                        }
                    }
                    _ => {}
                }
            }
            Some("turn.completed") => {
                let u = &ev["usage"];
                heard.push(Heard::Usage(
                    cairn_agent::Usage {
                        input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
                        output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
                        cache_read_tokens: u["cached_input_tokens"].as_u64(),
                        cache_write_tokens: u["cache_write_input_tokens"].as_u64(),
                        reasoning_tokens: u["reasoning_output_tokens"].as_u64(),
                    },
                    None,
                ));
            }
            // A turn that failed is the attempt's failure; other errors
            // (reconnects, warnings) only explain a CLI that ends without
            // a final message.
            Some("turn.failed") => {
                let msg = ev["error"]["message"]
                    .as_str()
                    .unwrap_or("the CLI reported a failed turn");
                heard.push(Heard::Failed(cut(msg, 2000)));
            }
            Some("error") => {
                if let Some(msg) = ev["message"].as_str() {
                    heard.push(Heard::Trouble(cut(msg, 2000)));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn heard(ev: Value) -> Vec<Heard> {
        let mut out = Vec::new();
        Codex.hear(&ev, &mut out);
        out
    }

    #[test]
    fn a_session_is_resumed_before_the_options_and_the_system_prompt_leads() {
        let model = super::super::testing::model("gpt", Some("http://127.0.0.1:9/v1"));
        let call = Call {
            prompt: "-p",
            system: Some("sys"),
            model: Some(&model),
            session: Some("t1"),
        };
        let argv = Codex.args(&call).unwrap();
        assert_eq!(
            &argv[..5],
            ["exec", "resume", "t1", "--json", "--skip-git-repo-check"]
        );
        assert_eq!(argv[5], "--model=gpt");
        assert!(argv[7].contains("base_url=\"http://127.0.0.1:9/v1\""));
        assert_eq!(&argv[argv.len() - 2..], ["--", "sys\n\n-p"]);
        let mut bad = model.clone();
        bad.base_url = Some("http://x\"y".into());
        let call = Call {
            model: Some(&bad),
            ..call
        };
        assert!(Codex.args(&call).is_err());
    }

    #[test]
    fn lines_become_output_the_final_message_and_usage_per_turn() {
        let started = json!({"type": "thread.started", "thread_id": "t1"});
        assert_eq!(Codex.session_in(&started), Some("t1"));
        let msg =
            json!({"type": "item.completed", "item": {"type": "agent_message", "text": "ok"}});
        match &heard(msg)[..] {
            [Heard::Output(OutputStream::Text, t), Heard::Final(f)] => {
                assert_eq!((t.as_str(), f.as_str()), ("ok\n", "ok"))
            }
            other => panic!("{other:?}"),
        }
        let turn = json!({"type": "turn.completed", "usage": {"input_tokens": 5, "cached_input_tokens": 2}});
        assert!(
            matches!(&heard(turn)[..], [Heard::Usage(u, None)] if u.input_tokens == 5 && u.cache_read_tokens == Some(2))
        );
        let failed = json!({"type": "turn.failed", "error": {"message": "quota"}});
        assert!(matches!(&heard(failed)[..], [Heard::Failed(e)] if e == "quota"));
        let warn = json!({"type": "error", "message": "reconnecting"});
        assert!(matches!(&heard(warn)[..], [Heard::Trouble(e)] if e == "reconnecting"));
        assert!(!Codex.is_boundary(&json!({"type": "item.completed"})));
    }
}
