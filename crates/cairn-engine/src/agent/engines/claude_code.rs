//! Claude Code: `claude -p --output-format stream-json --verbose`. Its
//! session is named by its `system` line and resumed with `--resume`,
//! which is also how a person takes it over. Usage comes from the final
//! `result` line only: its per-message snapshots would count tokens twice.

use cairn_events::OutputStream;
use serde_json::Value;

use super::{Call, Cli, Heard};
use crate::agent::cut;
use crate::node::NodeError;

/// The `claude-code` engine.
pub(super) struct ClaudeCode;

impl Cli for ClaudeCode {
    fn name(&self) -> &'static str {
        "claude-code"
    }

    fn program(&self) -> &'static str {
        "claude"
    }

    fn args(&self, call: &Call<'_>) -> Result<Vec<String>, NodeError> {
        let mut argv: Vec<String> = ["-p", "--output-format", "stream-json", "--verbose"]
            .map(String::from)
            .to_vec();
        // A value joined to its option with `=` is that option's value
        // whatever it starts with.
        if let Some(m) = call.model {
            argv.push(format!("--model={}", m.model));
        }
        if let Some(s) = call.system {
            argv.push(format!("--append-system-prompt={s}"));
        }
        if let Some(s) = call.session {
            argv.extend(["--resume".into(), s.to_string()]);
        }
        // The prompt is data: after `--`, no part of it is an option.
        argv.extend(["--".into(), call.prompt.to_string()]);
        Ok(argv)
    }

    fn provider_vars(&self) -> (&'static str, &'static str) {
        ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
    }

    fn quiet_env(&self) -> &'static [(&'static str, &'static str)] {
        // A CLI in a workflow reports to nobody but its provider: no
        // telemetry, error reports or update checks from inside the sandbox.
        &[
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_TELEMETRY", "1"),
        ]
    }

    fn session_in<'v>(&self, event: &'v Value) -> Option<&'v str> {
        if event["type"] == "system" {
            event["session_id"].as_str()
        } else {
            None
        }
    }

    fn hear(&self, ev: &Value, heard: &mut Vec<Heard>) {
        match ev["type"].as_str() {
            Some("system") => {
                if let Some(m) = ev["model"].as_str() {
                    heard.push(Heard::Model(m.to_string()));
                }
            }
            Some("assistant") => {
                for block in ev["message"]["content"].as_array().into_iter().flatten() {
                    match block["type"].as_str() {
                        Some("text") => {
                            if let Some(t) = block["text"].as_str() {
                                heard.push(Heard::Output(OutputStream::Text, t.to_string()));
                                heard.push(Heard::Message(t.to_string()));
                            }
                        }
                        Some("thinking") => {
                            if let Some(t) = block["thinking"].as_str() {
                                heard.push(Heard::Output(OutputStream::Reasoning, t.to_string()));
                            }
                        }
                        _ => {}
                    }
                }
            }
            Some("result") => {
                let u = &ev["usage"];
                heard.push(Heard::Usage(
                    cairn_agent::Usage {
                        input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
                        output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
                        cache_read_tokens: u["cache_read_input_tokens"].as_u64(),
                        cache_write_tokens: u["cache_creation_input_tokens"].as_u64(),
                        reasoning_tokens: None,
                    },
                    ev["total_cost_usd"].as_f64(),
                ));
                if ev["is_error"].as_bool() == Some(true)
                    || ev["subtype"].as_str().is_some_and(|t| t != "success")
                {
                    heard.push(Heard::Failed(format!(
                        "the run ended with `{}`: {}",
                        ev["subtype"].as_str().unwrap_or("error"),
                        cut(ev["result"].as_str().unwrap_or(""), 2000)
                    )));
                } else if let Some(r) = ev["result"].as_str() {
                    heard.push(Heard::Final(r.to_string()));
                }
            }
            _ => {}
        }
    }

    fn is_boundary(&self, event: &Value) -> bool {
        // A whole message, or the tools' results.
        matches!(event["type"].as_str(), Some("assistant" | "user"))
    }

    fn hands_over(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn heard(ev: Value) -> Vec<Heard> {
        let mut out = Vec::new();
        ClaudeCode.hear(&ev, &mut out);
        out
    }

    #[test]
    fn the_prompt_goes_after_the_options_and_values_join_them() {
        let model = super::super::testing::model("-m", None);
        let call = Call {
            prompt: "--help",
            system: Some("-s"),
            model: Some(&model),
            session: Some("abc"),
        };
        let argv = ClaudeCode.args(&call).unwrap();
        assert_eq!(
            argv,
            [
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--model=-m",
                "--append-system-prompt=-s",
                "--resume",
                "abc",
                "--",
                "--help"
            ]
        );
    }

    #[test]
    fn lines_become_output_messages_and_one_usage() {
        let system = json!({"type": "system", "session_id": "s1", "model": "opus"});
        assert_eq!(ClaudeCode.session_in(&system), Some("s1"));
        assert!(matches!(&heard(system)[..], [Heard::Model(m)] if m == "opus"));
        let assistant = json!({"type": "assistant", "message": {"content": [
            {"type": "thinking", "thinking": "hm"},
            {"type": "text", "text": "hi"},
        ]}});
        assert!(ClaudeCode.is_boundary(&assistant));
        match &heard(assistant)[..] {
            [Heard::Output(OutputStream::Reasoning, r), Heard::Output(OutputStream::Text, t), Heard::Message(m)] =>
            {
                assert_eq!((r.as_str(), t.as_str(), m.as_str()), ("hm", "hi", "hi"))
            }
            other => panic!("{other:?}"),
        }
        let result = json!({"type": "result", "subtype": "success", "result": "done",
            "usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 1},
            "total_cost_usd": 0.25});
        match &heard(result)[..] {
            [Heard::Usage(u, Some(c)), Heard::Final(f)] => {
                assert_eq!(
                    (u.input_tokens, u.output_tokens, u.cache_read_tokens),
                    (3, 4, Some(1))
                );
                assert_eq!((*c, f.as_str()), (0.25, "done"));
            }
            other => panic!("{other:?}"),
        }
        let failed = json!({"type": "result", "subtype": "error_max_turns", "result": "x"});
        assert!(
            matches!(&heard(failed)[..], [Heard::Usage(..), Heard::Failed(e)] if e.contains("error_max_turns"))
        );
    }
}
