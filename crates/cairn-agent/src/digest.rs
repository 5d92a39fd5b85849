//! A request's identity: what a replay matches a model call of its own to
//! one of the original's by (`AgentStepStarted.requestHash`).
//!
//! Two requests are the same when the same model is asked with the same
//! system prompt, messages and tools. Tools are taken sorted by name (the
//! order a toolbox lists them in is not the model's concern) and JSON
//! values with their keys sorted, so that the hash does not move with a
//! map's order. The provider's cache key is left out: it names the run, and
//! no replay could ever match it.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::client::ModelRequest;
use crate::message::{Message, ToolDef};

/// SHA-256 (hex) of `req` as asked of `provider`'s `model`.
pub fn request_hash(provider: &str, model: &str, req: &ModelRequest<'_>) -> String {
    let mut h = Fields(Sha256::new());
    h.text("cairn-request-1");
    h.text(provider);
    h.text(model);
    match &req.conversation.system {
        Some(s) => {
            h.tag(b'S');
            h.text(s);
        }
        None => h.tag(b'-'),
    }
    h.count(req.conversation.messages.len());
    for m in &req.conversation.messages {
        match m {
            Message::User { text } => {
                h.tag(b'u');
                h.text(text);
            }
            Message::Assistant(a) => {
                h.tag(b'a');
                h.opt(a.text.as_deref());
                h.opt(a.reasoning.as_deref());
                h.count(a.tool_calls.len());
                for c in &a.tool_calls {
                    h.text(&c.id);
                    h.text(&c.name);
                    h.text(&c.args);
                }
                match &a.provider_data {
                    Some(v) => h.text(&canonical_json(v)),
                    None => h.tag(b'-'),
                }
            }
            Message::ToolResults(rs) => {
                h.tag(b'r');
                h.count(rs.len());
                for r in rs {
                    h.text(&r.call_id);
                    h.text(&r.name);
                    h.text(&r.content);
                    h.tag(if r.is_error { b'e' } else { b'o' });
                }
            }
        }
    }
    let mut tools: Vec<&ToolDef> = req.tools.iter().collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    h.count(tools.len());
    for t in tools {
        h.text(&t.name);
        h.text(&tool_hash(t));
    }
    hex::encode(h.0.finalize())
}

/// SHA-256 (hex) of a tool's description and parameters: whether a tool
/// of the same name is offered as it was.
pub fn tool_hash(tool: &ToolDef) -> String {
    let mut h = Fields(Sha256::new());
    h.text(&tool.description);
    h.text(&canonical_json(&tool.parameters));
    hex::encode(h.0.finalize())
}

/// JSON text with every object's keys sorted, whatever order the value
/// holds them in.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&map[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// Fields fed to the hash each with its length, so that no two different
/// requests feed the same bytes.
struct Fields(Sha256);

impl Fields {
    fn text(&mut self, s: &str) {
        self.count(s.len());
        self.0.update(s.as_bytes());
    }

    fn opt(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.tag(b'+');
                self.text(s);
            }
            None => self.tag(b'-'),
        }
    }

    fn count(&mut self, n: usize) {
        self.0.update((n as u64).to_le_bytes());
    }

    fn tag(&mut self, t: u8) {
        self.0.update([t]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AssistantMessage, Conversation, ToolResult};
    use serde_json::json;

    fn tool(name: &str, params: Value) -> ToolDef {
        ToolDef {
            name: name.into(),
            description: format!("the {name} tool"),
            parameters: params,
        }
    }

    fn convo(user: &str) -> Conversation {
        Conversation {
            system: Some("be brief".into()),
            messages: vec![
                Message::User { text: user.into() },
                Message::Assistant(AssistantMessage {
                    text: None,
                    tool_calls: vec![crate::ToolCall {
                        id: "c1".into(),
                        name: "read".into(),
                        args: "{\"path\":\"a\"}".into(),
                    }],
                    ..Default::default()
                }),
                Message::ToolResults(vec![ToolResult {
                    call_id: "c1".into(),
                    name: "read".into(),
                    content: "x".into(),
                    is_error: false,
                }]),
            ],
        }
    }

    #[test]
    fn the_same_request_has_the_same_hash_whatever_the_order_of_tools_and_keys() {
        let c = convo("hello");
        let a = [
            tool("read", json!({"type": "object", "required": ["path"]})),
            tool("write", json!({})),
        ];
        let b = [
            tool("write", json!({})),
            tool(
                "read",
                serde_json::from_str(r#"{"required":["path"],"type":"object"}"#).unwrap(),
            ),
        ];
        let req = |tools: &'static [ToolDef], key| ModelRequest {
            conversation: &c,
            tools,
            cache_key: key,
        };
        let a: &'static [ToolDef] = Box::leak(Box::new(a));
        let b: &'static [ToolDef] = Box::leak(Box::new(b));
        let h = request_hash("openai", "gpt-4o", &req(a, Some("k1")));
        assert_eq!(h, request_hash("openai", "gpt-4o", &req(b, Some("k2"))));
        assert_eq!(h.len(), 64);
    }

    #[test]
    fn any_change_of_model_prompt_result_or_tool_changes_the_hash() {
        let c = convo("hello");
        let tools = [tool("read", json!({"type": "object"}))];
        let req = ModelRequest {
            conversation: &c,
            tools: &tools,
            cache_key: None,
        };
        let base = request_hash("openai", "gpt-4o", &req);
        assert_ne!(base, request_hash("openai", "gpt-4o-mini", &req));
        assert_ne!(base, request_hash("anthropic", "gpt-4o", &req));
        let other = convo("hello!");
        assert_ne!(
            base,
            request_hash(
                "openai",
                "gpt-4o",
                &ModelRequest {
                    conversation: &other,
                    ..req
                }
            )
        );
        let mut result = convo("hello");
        if let Message::ToolResults(rs) = &mut result.messages[2] {
            rs[0].is_error = true;
        }
        assert_ne!(
            base,
            request_hash(
                "openai",
                "gpt-4o",
                &ModelRequest {
                    conversation: &result,
                    ..req
                }
            )
        );
        let changed = [tool("read", json!({"type": "string"}))];
        assert_ne!(
            base,
            request_hash(
                "openai",
                "gpt-4o",
                &ModelRequest {
                    tools: &changed,
                    ..req
                }
            )
        );
        assert_ne!(
            base,
            request_hash("openai", "gpt-4o", &ModelRequest { tools: &[], ..req })
        );
    }
}
