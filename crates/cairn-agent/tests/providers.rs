//! Each provider against a real HTTP server on 127.0.0.1 that streams its
//! wire format as the providers do, cut in awkward places.

use std::sync::Arc;
use std::time::Duration;

use cairn_agent::testing::{End, FakeProvider, Reply};
use cairn_agent::{
    client_for, AssistantMessage, Backoff, Conversation, FinishReason, Message, ModelClient,
    ModelConfig, ModelErrorKind, ModelRequest, ProviderKind, RetryPolicy, Script, StreamEvent,
    ToolCall, ToolDef, ToolResult,
};
use serde_json::{json, Value};

const KEY: &str = "sk-test-0123456789abcdef";

fn config(provider: ProviderKind, server: &FakeProvider) -> ModelConfig {
    let model = match provider {
        ProviderKind::Anthropic => "claude-sonnet-4-5",
        ProviderKind::OpenAiResponses => "gpt-5.1",
        ProviderKind::Gemini => "gemini-2.5-flash",
        _ => "gpt-4o",
    };
    let mut c = ModelConfig::new(provider, model);
    c.base_url = Some(server.url());
    c.api_key_env = Some("CAIRN_TEST_PROVIDER_KEY".into());
    c.idle_timeout = Some(Duration::from_millis(300));
    c.retry = Some(RetryPolicy {
        attempts: 3,
        delay: Duration::from_millis(5),
        backoff: Backoff::Exponential,
        max_delay: Duration::from_millis(20),
    });
    c
}

fn client(c: &ModelConfig) -> Arc<dyn ModelClient> {
    std::env::set_var("CAIRN_TEST_PROVIDER_KEY", KEY);
    client_for(c, None).expect("client")
}

fn convo() -> Conversation {
    Conversation {
        system: Some("Be brief.".into()),
        messages: vec![Message::User {
            text: "Read a.txt".into(),
        }],
    }
}

fn tools() -> Vec<ToolDef> {
    vec![ToolDef {
        name: "read".into(),
        description: "Read a file".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
    }]
}

/// Runs one call and collects what it streamed.
async fn call(
    m: &Arc<dyn ModelClient>,
    c: &Conversation,
) -> (
    Result<cairn_agent::ModelResponse, cairn_agent::ModelError>,
    Vec<String>,
) {
    let tools = tools();
    let req = ModelRequest {
        conversation: c,
        tools: &tools,
        cache_key: None,
    };
    let mut seen = Vec::new();
    let mut on = |e: StreamEvent<'_>| {
        seen.push(match e {
            StreamEvent::Text(t) => format!("text:{t}"),
            StreamEvent::Reasoning(t) => format!("reasoning:{t}"),
            StreamEvent::Retrying {
                attempt, reason, ..
            } => format!("retry:{attempt}:{reason}"),
        })
    };
    let r = m.complete(&req, &mut on).await;
    (r, seen)
}

fn openai_chunk(delta: Value) -> String {
    json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]}).to_string()
}

#[tokio::test]
async fn openai_streams_text_and_parallel_tool_calls_split_mid_token() {
    let server = FakeProvider::start().await;
    let finish =
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).to_string();
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 33,
        "prompt_tokens_details": {"cached_tokens": 100}, "completion_tokens_details": {"reasoning_tokens": 7}}}).to_string();
    // Raw bytes split inside a JSON string and inside an event.
    let events = [
        openai_chunk(json!({"role": "assistant", "content": "Let me "})),
        openai_chunk(json!({"content": "look."})),
        openai_chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "read", "arguments": ""}}]}),
        ),
        openai_chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "read", "arguments": "{\"pa"}}]}),
        ),
        openai_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\": \"a."}}]}),
        ),
        openai_chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "txt\"}"}}]})),
        openai_chunk(
            json!({"tool_calls": [{"index": 1, "function": {"arguments": "th\": \"b.txt\"}"}}]}),
        ),
        finish,
        usage,
        "[DONE]".to_string(),
    ];
    let text: String = events.iter().map(|d| format!("data: {d}\n\n")).collect();
    let bytes = text.as_bytes();
    let cuts = [7, 50, 51, 300, bytes.len() - 5];
    let mut pieces = Vec::new();
    let mut at = 0;
    for c in cuts {
        pieces.push(bytes[at..c].to_vec());
        at = c;
    }
    pieces.push(bytes[at..].to_vec());
    server.push(Reply::chunks(pieces));
    let c = config(ProviderKind::OpenAi, &server);
    let m = client(&c);
    let (r, seen) = call(&m, &convo()).await;
    let r = r.expect("answer");
    assert_eq!(r.message.text.as_deref(), Some("Let me look."));
    assert_eq!(
        r.message.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "read".into(),
                args: "{\"path\": \"a.txt\"}".into()
            },
            ToolCall {
                id: "call_b".into(),
                name: "read".into(),
                args: "{\"path\": \"b.txt\"}".into()
            },
        ]
    );
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (120, 33));
    assert_eq!(r.usage.cache_read_tokens, Some(100));
    assert_eq!(r.usage.reasoning_tokens, Some(7));
    // gpt-4o: 20 full input tokens at 2.5, 100 cached at 1.25, 33 out at 10.
    let cost = r.cost_usd.expect("priced");
    assert!(
        (cost - (20.0 * 2.5 + 100.0 * 1.25 + 33.0 * 10.0) / 1e6).abs() < 1e-12,
        "{cost}"
    );
    assert_eq!(seen, vec!["text:Let me ", "text:look."]);

    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, "/chat/completions");
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let body = &reqs[0].body;
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(body["tools"][0]["function"]["name"], "read");
}

#[tokio::test]
async fn openai_sends_the_conversation_back_as_it_was() {
    let server = FakeProvider::start().await;
    server.push(Reply::sse([
        openai_chunk(json!({"content": "done"})),
        "[DONE]".into(),
    ]));
    let c = config(ProviderKind::OpenAi, &server);
    let m = client(&c);
    let mut conversation = convo();
    conversation
        .messages
        .push(Message::Assistant(AssistantMessage {
            text: None,
            tool_calls: vec![ToolCall {
                id: "call_a".into(),
                name: "read".into(),
                args: "{\"path\":\"a.txt\"}".into(),
            }],
            ..AssistantMessage::default()
        }));
    conversation
        .messages
        .push(Message::ToolResults(vec![ToolResult {
            call_id: "call_a".into(),
            name: "read".into(),
            content: "hello".into(),
            is_error: false,
        }]));
    let (r, _) = call(&m, &conversation).await;
    let r = r.unwrap();
    assert_eq!(r.finish_reason, FinishReason::Stop);
    // No usage chunk (as llama.cpp's server streams): zero, not an error.
    assert_eq!(r.usage.input_tokens, 0);
    let body = &server.requests()[0].body;
    assert_eq!(
        body["messages"][2]["tool_calls"][0]["function"]["arguments"],
        "{\"path\":\"a.txt\"}"
    );
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_a", "content": "hello"})
    );
    // The same conversation gives the same bytes.
    let again = cairn_agent::openai::OpenAi::new(&c, KEY.into()).unwrap();
    let tools = tools();
    let req = ModelRequest {
        conversation: &conversation,
        tools: &tools,
        cache_key: None,
    };
    assert_eq!(again.body(&req).to_string(), again.body(&req).to_string());
}

#[tokio::test]
async fn a_429_is_retried_after_the_wait_it_asks_for_and_reported() {
    let server = FakeProvider::start().await;
    server.push(
        Reply::status(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after-ms", "30"),
    );
    server.push(Reply::status(503, r#"{"error":{"message":"overloaded"}}"#));
    server.push(Reply::sse([
        openai_chunk(json!({"content": "ok"})),
        "[DONE]".into(),
    ]));
    let c = config(ProviderKind::OpenAi, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    assert_eq!(r.unwrap().message.text.as_deref(), Some("ok"));
    assert_eq!(seen[0], "retry:2:http 429");
    assert_eq!(seen[1], "retry:3:http 503");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn retries_end_with_the_last_failure() {
    let server = FakeProvider::start().await;
    server.fallback(
        Reply::status(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "0"),
    );
    let c = config(ProviderKind::OpenAi, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ModelErrorKind::RateLimited);
    assert_eq!(e.status, Some(429));
    assert!(e.message.contains("slow down"), "{e}");
    assert_eq!(seen.len(), 2);
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn a_refused_request_is_not_retried_and_the_key_never_shows() {
    let server = FakeProvider::start().await;
    server.push(Reply::status(
        400,
        &json!({"error": {"message": format!("bad request from key {KEY}")}}).to_string(),
    ));
    let c = config(ProviderKind::OpenAi, &server);
    let (r, _) = call(&client(&c), &convo()).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ModelErrorKind::BadRequest);
    assert!(
        !e.message.contains(KEY) && !format!("{e:?}").contains(KEY),
        "{e:?}"
    );
    assert!(e.message.contains("[redacted]"), "{e}");
    assert_eq!(server.requests().len(), 1);

    server.push(Reply::status(401, r#"{"error":{"message":"invalid key"}}"#));
    let (r, _) = call(&client(&c), &convo()).await;
    assert_eq!(r.unwrap_err().kind, ModelErrorKind::Auth);
}

#[tokio::test]
async fn a_missing_key_names_its_variable() {
    let mut c = ModelConfig::new(ProviderKind::Anthropic, "claude-sonnet-4-5");
    c.api_key_env = Some("CAIRN_TEST_NO_SUCH_KEY".into());
    let e = client_for(&c, None).err().expect("no key");
    assert_eq!(e.kind, ModelErrorKind::Auth);
    assert!(e.message.contains("CAIRN_TEST_NO_SUCH_KEY"), "{e}");
}

#[tokio::test]
async fn an_error_event_mid_stream_fails_the_call() {
    let server = FakeProvider::start().await;
    server.push(Reply::sse([
        openai_chunk(json!({"content": "Half an ans"})),
        json!({"error": {"message": "model crashed", "type": "server_error"}}).to_string(),
    ]));
    let c = config(ProviderKind::OpenAi, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ModelErrorKind::StreamError);
    assert!(e.message.contains("model crashed"));
    assert_eq!(seen, vec!["text:Half an ans"]);
    assert_eq!(
        server.requests().len(),
        1,
        "never re-sent once the answer began"
    );
}

#[tokio::test]
async fn a_stream_that_stops_without_its_end_is_interrupted_not_resent() {
    let server = FakeProvider::start().await;
    server.push(Reply::sse([openai_chunk(json!({"content": "Half"}))]));
    server.push(Reply::sse([openai_chunk(json!({"content": "Half"}))]).ending(End::Abort));
    let c = config(ProviderKind::OpenAi, &server);
    for _ in 0..2 {
        let (r, _) = call(&client(&c), &convo()).await;
        assert_eq!(r.unwrap_err().kind, ModelErrorKind::Interrupted);
    }
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn silence_before_and_inside_an_answer() {
    let server = FakeProvider::start().await;
    // Silent before answering: retried, then the silence is the error.
    server.fallback(Reply::silent(Duration::from_secs(30)));
    let c = config(ProviderKind::OpenAi, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    assert_eq!(r.unwrap_err().kind, ModelErrorKind::IdleTimeout);
    assert_eq!(seen.len(), 2, "{seen:?}");

    // Silent after the answer began: no retry.
    let server = FakeProvider::start().await;
    server.push(Reply::sse([openai_chunk(json!({"content": "Hel"}))]).ending(End::Hang));
    let c = config(ProviderKind::OpenAi, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    assert_eq!(r.unwrap_err().kind, ModelErrorKind::IdleTimeout);
    assert_eq!(seen, vec!["text:Hel"]);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_dropped_connection_before_the_answer_is_retried() {
    let server = FakeProvider::start().await;
    server.push(Reply::chunks(Vec::<Vec<u8>>::new()).ending(End::Abort));
    server.push(Reply::sse([
        openai_chunk(json!({"content": "ok"})),
        "[DONE]".into(),
    ]));
    let c = config(ProviderKind::OpenAi, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    assert_eq!(r.unwrap().message.text.as_deref(), Some("ok"));
    assert!(seen[0].starts_with("retry:2:"), "{seen:?}");
}

#[tokio::test]
async fn the_whole_call_has_a_timeout() {
    let server = FakeProvider::start().await;
    let slow: Vec<String> = (0..50)
        .map(|_| format!("data: {}\n\n", openai_chunk(json!({"content": "."}))))
        .collect();
    server.push(Reply::chunks(slow).every(Duration::from_millis(20)));
    let mut c = config(ProviderKind::OpenAi, &server);
    c.timeout = Some(Duration::from_millis(200));
    let (r, _) = call(&client(&c), &convo()).await;
    assert_eq!(r.unwrap_err().kind, ModelErrorKind::Timeout);
}

fn anthropic_stream() -> Vec<(&'static str, String)> {
    vec![
        ("message_start", json!({"type": "message_start", "message": {"id": "m1", "role": "assistant", "content": [],
            "usage": {"input_tokens": 50, "output_tokens": 1, "cache_read_input_tokens": 200, "cache_creation_input_tokens": 30}}}).to_string()),
        ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}).to_string()),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "The file "}}).to_string()),
        ("ping", json!({"type": "ping"}).to_string()),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "is named."}}).to_string()),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig-123"}}).to_string()),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 0}).to_string()),
        ("content_block_start", json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}).to_string()),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Reading."}}).to_string()),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 1}).to_string()),
        ("content_block_start", json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}}).to_string()),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"a"}}).to_string()),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ".txt\"}"}}).to_string()),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 2}).to_string()),
        ("content_block_start", json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {}}}).to_string()),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 3}).to_string()),
        ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 10}}).to_string()),
        ("message_delta", json!({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 25}}).to_string()),
        ("message_stop", json!({"type": "message_stop"}).to_string()),
    ]
}

#[tokio::test]
async fn anthropic_thinking_tools_and_cumulative_usage() {
    let server = FakeProvider::start().await;
    server.push(Reply::named_sse(anthropic_stream()));
    let c = config(ProviderKind::Anthropic, &server);
    let m = client(&c);
    let (r, seen) = call(&m, &convo()).await;
    let r = r.expect("answer");
    assert_eq!(r.message.text.as_deref(), Some("Reading."));
    assert_eq!(r.message.reasoning.as_deref(), Some("The file is named."));
    assert_eq!(
        r.message.tool_calls,
        vec![
            ToolCall {
                id: "toolu_1".into(),
                name: "read".into(),
                args: "{\"path\": \"a.txt\"}".into()
            },
            ToolCall {
                id: "toolu_2".into(),
                name: "read".into(),
                args: "{}".into()
            },
        ]
    );
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    // message_delta's usage is cumulative: 25, not 1 + 10 + 25.
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (50, 25));
    assert_eq!(
        (r.usage.cache_read_tokens, r.usage.cache_write_tokens),
        (Some(200), Some(30))
    );
    let cost = r.cost_usd.unwrap();
    assert!((cost - (50.0 * 3.0 + 200.0 * 0.30 + 30.0 * 3.75 + 25.0 * 15.0) / 1e6).abs() < 1e-12);
    assert_eq!(
        seen,
        vec![
            "reasoning:The file ",
            "reasoning:is named.",
            "text:Reading."
        ]
    );

    let req = &server.requests()[0];
    assert_eq!(req.path, "/v1/messages");
    assert_eq!(req.header("x-api-key"), Some(KEY));
    assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
    // Prompt caching: breakpoints on the system prompt, the last tool and
    // the last message.
    let ephemeral = json!({"type": "ephemeral"});
    assert_eq!(
        req.body["system"],
        json!([{"type": "text", "text": "Be brief.", "cache_control": ephemeral}])
    );
    assert_eq!(req.body["max_tokens"], 8192);
    assert_eq!(req.body["tools"][0]["input_schema"]["type"], "object");
    assert_eq!(req.body["tools"][0]["cache_control"], ephemeral);
    assert_eq!(
        req.body["messages"][0]["content"],
        json!([{"type": "text", "text": "Read a.txt", "cache_control": ephemeral}])
    );

    // The next request carries the thinking block with its signature first.
    server.push(Reply::named_sse(vec![
        ("message_start", json!({"type": "message_start", "message": {"usage": {"input_tokens": 80, "output_tokens": 1}}}).to_string()),
        ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}).to_string()),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Done."}}).to_string()),
        ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}).to_string()),
        ("message_stop", json!({"type": "message_stop"}).to_string()),
    ]));
    let mut next = convo();
    next.messages.push(Message::Assistant(r.message.clone()));
    next.messages.push(Message::ToolResults(vec![
        ToolResult {
            call_id: "toolu_1".into(),
            name: "read".into(),
            content: "hello".into(),
            is_error: false,
        },
        ToolResult {
            call_id: "toolu_2".into(),
            name: "read".into(),
            content: "error (arguments): `path` is required".into(),
            is_error: true,
        },
    ]));
    let (r2, _) = call(&m, &next).await;
    assert_eq!(r2.unwrap().finish_reason, FinishReason::Stop);
    let body = &server.requests()[1].body;
    let assistant = &body["messages"][1]["content"];
    assert_eq!(
        assistant[0],
        json!({"type": "thinking", "thinking": "The file is named.", "signature": "sig-123"})
    );
    assert_eq!(assistant[1], json!({"type": "text", "text": "Reading."}));
    assert_eq!(assistant[2]["input"], json!({"path": "a.txt"}));
    let results = &body["messages"][2]["content"];
    assert_eq!(results[1]["is_error"], true);
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    // The second step reads what the first cached (its last message is
    // still marked) and marks its own end for the third; nothing else.
    assert_eq!(
        body["messages"][0]["content"][0]["cache_control"],
        ephemeral
    );
    assert_eq!(results[1]["cache_control"], ephemeral);
    assert!(results[0].get("cache_control").is_none());
    let marks = body.to_string().matches("\"cache_control\"").count();
    assert_eq!(marks, 4, "the API allows four breakpoints");
    // Without prompt caching, no marks and the system prompt as text.
    let mut off = c.clone();
    off.prompt_cache = Some(false);
    let plain = cairn_agent::anthropic::Anthropic::new(&off, KEY.into()).unwrap();
    let tools = tools();
    let req = ModelRequest {
        conversation: &next,
        tools: &tools,
        cache_key: Some("k"),
    };
    let body = plain.body(&req);
    assert_eq!(body["system"], "Be brief.");
    assert!(!body.to_string().contains("cache_control"));
}

#[tokio::test]
async fn anthropic_error_event_and_overload() {
    let server = FakeProvider::start().await;
    server.push(Reply::status(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ));
    let mut events = anthropic_stream();
    events.truncate(9);
    events.push((
        "error",
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            .to_string(),
    ));
    server.push(Reply::named_sse(events));
    let c = config(ProviderKind::Anthropic, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ModelErrorKind::StreamError);
    assert!(e.message.contains("Overloaded"));
    assert_eq!(seen[0], "retry:2:http 529");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn scripted_turns_replay_by_the_conversations_length() {
    let script = Script::from_value(json!({
        "chunk_chars": 4,
        "turns": [
            {"text": "Reading now", "tool_calls": [{"name": "read", "args": {"path": "a.txt"}}], "usage": {"input": 10, "output": 5}},
            {"text": "Done.", "tool_calls": [{"name": "read", "args_raw": "{\"path\": "}]},
        ]
    }))
    .unwrap();
    let c = ModelConfig::new(ProviderKind::Scripted, "demo");
    let m = client_for(&c, Some(Arc::new(script))).unwrap();
    let (r, seen) = call(&m, &convo()).await;
    let r = r.unwrap();
    assert_eq!(seen, vec!["text:Read", "text:ing ", "text:now"]);
    assert_eq!(r.message.tool_calls[0].args, "{\"path\":\"a.txt\"}");
    assert_eq!(r.message.tool_calls[0].id, "call_1_0");
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (10, 5));
    assert_eq!(r.cost_usd, None);
    let mut next = convo();
    next.messages.push(Message::Assistant(r.message));
    let (r2, _) = call(&m, &next).await;
    let r2 = r2.unwrap();
    assert_eq!(
        r2.message.tool_calls[0].args, "{\"path\": ",
        "scripted broken arguments"
    );
    assert!(r2.usage.input_tokens > 0);
    next.messages.push(Message::Assistant(r2.message));
    let e = call(&m, &next).await.0.unwrap_err();
    assert_eq!(e.kind, ModelErrorKind::Config);
    assert!(e.message.contains("has 2 turns"), "{e}");
}

#[test]
fn a_bad_script_names_the_turn() {
    let e = Script::from_value(json!({"turns": [{"text": "a"}, {"txt": "b"}]})).unwrap_err();
    assert!(e.starts_with("turn 2: unknown field `txt`"), "{e}");
    let e = Script::from_value(json!({"turns": []})).unwrap_err();
    assert!(e.contains("no turns"), "{e}");
    let e =
        Script::from_value(json!({"turns": [{"text": "a"}], "chunk_delay": "soon"})).unwrap_err();
    assert!(e.contains("not a duration"), "{e}");
}

/// Runs one call with a prompt-cache key and collects what it streamed.
async fn call_keyed(
    m: &Arc<dyn ModelClient>,
    c: &Conversation,
    cache_key: Option<&str>,
) -> (
    Result<cairn_agent::ModelResponse, cairn_agent::ModelError>,
    Vec<String>,
) {
    let tools = tools();
    let req = ModelRequest {
        conversation: c,
        tools: &tools,
        cache_key,
    };
    let mut seen = Vec::new();
    let mut on = |e: StreamEvent<'_>| {
        seen.push(match e {
            StreamEvent::Text(t) => format!("text:{t}"),
            StreamEvent::Reasoning(t) => format!("reasoning:{t}"),
            StreamEvent::Retrying {
                attempt, reason, ..
            } => format!("retry:{attempt}:{reason}"),
        })
    };
    let r = m.complete(&req, &mut on).await;
    (r, seen)
}

/// An assistant message as the log gives it back: through its JSON.
fn as_logged(m: &AssistantMessage) -> AssistantMessage {
    serde_json::from_value(serde_json::to_value(m).unwrap()).unwrap()
}

/// The conversation after `answer` and its two calls' results (the second
/// failed).
fn after_tools(answer: &AssistantMessage, ids: [&str; 2]) -> Conversation {
    let mut next = convo();
    next.messages.push(Message::Assistant(answer.clone()));
    next.messages.push(Message::ToolResults(vec![
        ToolResult {
            call_id: ids[0].into(),
            name: "read".into(),
            content: "hello".into(),
            is_error: false,
        },
        ToolResult {
            call_id: ids[1].into(),
            name: "read".into(),
            content: "error: no such file".into(),
            is_error: true,
        },
    ]));
    next
}

/// One Responses event, named as its `type`.
fn rev(data: Value) -> (String, String) {
    (data["type"].as_str().unwrap().to_string(), data.to_string())
}

fn responses_reasoning_item() -> Value {
    json!({"id": "rs_1", "type": "reasoning", "summary": [
        {"type": "summary_text", "text": "The file is named."},
        {"type": "summary_text", "text": "Read it."}],
        "encrypted_content": "gAAAAB-encrypted-1"})
}

fn responses_completed(usage: Value) -> (String, String) {
    rev(json!({"type": "response.completed", "sequence_number": 99,
        "response": {"id": "resp_1", "object": "response", "status": "completed", "usage": usage}}))
}

/// Reasoning in two summary parts, text, a call streamed by deltas and one
/// whose arguments come only whole.
fn responses_stream() -> Vec<(String, String)> {
    vec![
        rev(json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}})),
        rev(json!({"type": "response.in_progress", "sequence_number": 1,
            "response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}})),
        rev(
            json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
        ),
        rev(
            json!({"type": "response.reasoning_summary_part.added", "sequence_number": 3, "item_id": "rs_1",
            "output_index": 0, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
        ),
        rev(
            json!({"type": "response.reasoning_summary_text.delta", "sequence_number": 4, "item_id": "rs_1",
            "output_index": 0, "summary_index": 0, "delta": "The file "}),
        ),
        rev(
            json!({"type": "response.reasoning_summary_text.delta", "sequence_number": 5, "item_id": "rs_1",
            "output_index": 0, "summary_index": 0, "delta": "is named."}),
        ),
        rev(
            json!({"type": "response.reasoning_summary_text.done", "sequence_number": 6, "item_id": "rs_1",
            "output_index": 0, "summary_index": 0, "text": "The file is named."}),
        ),
        rev(
            json!({"type": "response.reasoning_summary_part.added", "sequence_number": 7, "item_id": "rs_1",
            "output_index": 0, "summary_index": 1, "part": {"type": "summary_text", "text": ""}}),
        ),
        rev(
            json!({"type": "response.reasoning_summary_text.delta", "sequence_number": 8, "item_id": "rs_1",
            "output_index": 0, "summary_index": 1, "delta": "Read it."}),
        ),
        rev(
            json!({"type": "response.output_item.done", "sequence_number": 9, "output_index": 0,
            "item": responses_reasoning_item()}),
        ),
        rev(
            json!({"type": "response.output_item.added", "sequence_number": 10, "output_index": 1,
            "item": {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        ),
        rev(
            json!({"type": "response.content_part.added", "sequence_number": 11, "item_id": "msg_1",
            "output_index": 1, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
        ),
        rev(
            json!({"type": "response.output_text.delta", "sequence_number": 12, "item_id": "msg_1",
            "output_index": 1, "content_index": 0, "delta": "Reading "}),
        ),
        rev(
            json!({"type": "response.output_text.delta", "sequence_number": 13, "item_id": "msg_1",
            "output_index": 1, "content_index": 0, "delta": "both."}),
        ),
        rev(
            json!({"type": "response.output_text.done", "sequence_number": 14, "item_id": "msg_1",
            "output_index": 1, "content_index": 0, "text": "Reading both."}),
        ),
        rev(
            json!({"type": "response.output_item.done", "sequence_number": 15, "output_index": 1,
            "item": {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "Reading both.", "annotations": []}]}}),
        ),
        rev(
            json!({"type": "response.output_item.added", "sequence_number": 16, "output_index": 2,
            "item": {"id": "fc_1", "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": "call_a", "name": "read"}}),
        ),
        rev(
            json!({"type": "response.function_call_arguments.delta", "sequence_number": 17, "item_id": "fc_1",
            "output_index": 2, "delta": "{\"path\":"}),
        ),
        rev(
            json!({"type": "response.function_call_arguments.delta", "sequence_number": 18, "item_id": "fc_1",
            "output_index": 2, "delta": " \"a.txt\"}"}),
        ),
        rev(
            json!({"type": "response.function_call_arguments.done", "sequence_number": 19, "item_id": "fc_1",
            "output_index": 2, "arguments": "{\"path\": \"a.txt\"}"}),
        ),
        rev(
            json!({"type": "response.output_item.done", "sequence_number": 20, "output_index": 2,
            "item": {"id": "fc_1", "type": "function_call", "status": "completed",
                "arguments": "{\"path\": \"a.txt\"}", "call_id": "call_a", "name": "read"}}),
        ),
        rev(
            json!({"type": "response.output_item.added", "sequence_number": 21, "output_index": 3,
            "item": {"id": "fc_2", "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": "call_b", "name": "read"}}),
        ),
        rev(
            json!({"type": "response.output_item.done", "sequence_number": 22, "output_index": 3,
            "item": {"id": "fc_2", "type": "function_call", "status": "completed",
                "arguments": "{\"path\":\"b.txt\"}", "call_id": "call_b", "name": "read"}}),
        ),
        responses_completed(
            json!({"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 1000},
            "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 200}, "total_tokens": 1500}),
        ),
    ]
}

fn responses_text(text: &str) -> Vec<(String, String)> {
    vec![
        rev(
            json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
            "item": {"id": "msg_2", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        ),
        rev(
            json!({"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_2",
            "output_index": 0, "content_index": 0, "delta": text}),
        ),
        responses_completed(json!({"input_tokens": 10, "output_tokens": 2})),
    ]
}

#[tokio::test]
async fn responses_stream_reasoning_text_and_calls_and_send_the_reasoning_back() {
    let server = FakeProvider::start().await;
    server.push(Reply::named_sse(responses_stream()));
    let c = config(ProviderKind::OpenAiResponses, &server);
    let m = client(&c);
    let (r, seen) = call(&m, &convo()).await;
    let r = r.expect("answer");
    assert_eq!(r.message.text.as_deref(), Some("Reading both."));
    assert_eq!(
        r.message.reasoning.as_deref(),
        Some("The file is named.\n\nRead it.")
    );
    assert_eq!(
        r.message.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "read".into(),
                args: "{\"path\": \"a.txt\"}".into()
            },
            ToolCall {
                id: "call_b".into(),
                name: "read".into(),
                args: "{\"path\":\"b.txt\"}".into()
            },
        ]
    );
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        r.message.provider_data,
        Some(json!({"reasoning": [responses_reasoning_item()]}))
    );
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (1200, 300));
    assert_eq!(r.usage.cache_read_tokens, Some(1000));
    assert_eq!(r.usage.reasoning_tokens, Some(200));
    // gpt-5.1: 200 full input tokens at 1.25, 1000 cached at 0.125, 300 out at 10.
    let cost = r.cost_usd.expect("priced");
    assert!(
        (cost - (200.0 * 1.25 + 1000.0 * 0.125 + 300.0 * 10.0) / 1e6).abs() < 1e-12,
        "{cost}"
    );
    assert_eq!(
        seen,
        vec![
            "reasoning:The file ",
            "reasoning:is named.",
            "reasoning:\n\n",
            "reasoning:Read it.",
            "text:Reading ",
            "text:both."
        ]
    );

    let req = &server.requests()[0];
    assert_eq!(req.path, "/responses");
    assert_eq!(
        req.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let body = &req.body;
    assert_eq!(body["model"], "gpt-5.1");
    assert_eq!(body["stream"], true);
    assert_eq!(body["store"], false);
    assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(body["instructions"], "Be brief.");
    assert_eq!(
        body["input"],
        json!([{"role": "user", "content": "Read a.txt"}])
    );
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "name": "read", "description": "Read a file",
            "parameters": tools()[0].parameters, "strict": false})
    );
    assert!(body.get("prompt_cache_key").is_none());
    assert!(body.get("max_output_tokens").is_none());

    // The next request carries the reasoning item exactly, before the
    // turn's text and calls, then the results, and the cache key.
    server.push(Reply::named_sse(responses_text("Done.")));
    let next = after_tools(&r.message, ["call_a", "call_b"]);
    let (r2, _) = call_keyed(&m, &next, Some("run-1/fix/1")).await;
    let r2 = r2.unwrap();
    assert_eq!(r2.finish_reason, FinishReason::Stop);
    assert_eq!(r2.message.provider_data, None);
    let body = &server.requests()[1].body;
    assert_eq!(body["prompt_cache_key"], "run-1/fix/1");
    assert_eq!(
        body["input"],
        json!([
            {"role": "user", "content": "Read a.txt"},
            responses_reasoning_item(),
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading both."}]},
            {"type": "function_call", "call_id": "call_a", "name": "read", "arguments": "{\"path\": \"a.txt\"}"},
            {"type": "function_call", "call_id": "call_b", "name": "read", "arguments": "{\"path\":\"b.txt\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "hello"},
            {"type": "function_call_output", "call_id": "call_b", "output": "error: no such file"},
        ])
    );

    // Rebuilt from the log, the conversation gives the same bytes.
    let again = cairn_agent::openai_responses::OpenAiResponses::new(&c, KEY.into()).unwrap();
    let logged = after_tools(&as_logged(&r.message), ["call_a", "call_b"]);
    let tools = tools();
    let req = |c| ModelRequest {
        conversation: c,
        tools: &tools,
        cache_key: Some("run-1/fix/1"),
    };
    let bytes = serde_json::to_vec(&again.body(&req(&next))).unwrap();
    assert_eq!(
        bytes,
        serde_json::to_vec(&again.body(&req(&logged))).unwrap()
    );
    assert_eq!(bytes, serde_json::to_vec(body).unwrap());
}

#[tokio::test]
async fn responses_settings_and_an_incomplete_answer() {
    let server = FakeProvider::start().await;
    server.push(Reply::named_sse(vec![
        rev(json!({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1",
            "output_index": 0, "content_index": 0, "delta": "Half"})),
        rev(json!({"type": "response.incomplete", "sequence_number": 2,
            "response": {"id": "resp_1", "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "usage": {"input_tokens": 40, "output_tokens": 16, "output_tokens_details": {"reasoning_tokens": 12}}}})),
    ]));
    let mut c = config(ProviderKind::OpenAiResponses, &server);
    c.model = "gpt-4o".into();
    c.max_tokens = Some(16);
    c.temperature = Some(0.5);
    let (r, _) = call(&client(&c), &convo()).await;
    let r = r.unwrap();
    assert_eq!(r.finish_reason, FinishReason::MaxTokens);
    assert_eq!(r.message.text.as_deref(), Some("Half"));
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (40, 16));
    assert_eq!(r.usage.reasoning_tokens, Some(12));
    let body = &server.requests()[0].body;
    assert_eq!(body["max_output_tokens"], 16);
    assert_eq!(body["temperature"], 0.5);
    // A model that never reasons is not asked for encrypted reasoning.
    assert!(body.get("include").is_none());
}

#[tokio::test]
async fn responses_retries_errors_and_cut_streams() {
    let server = FakeProvider::start().await;
    // 429 with the wait it asks for, then a 500, then the answer.
    server.push(
        Reply::status(
            429,
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        )
        .header("retry-after", "0"),
    );
    server.push(Reply::status(
        500,
        r#"{"error":{"message":"The server had an error","type":"server_error"}}"#,
    ));
    server.push(Reply::named_sse(responses_text("ok")));
    let c = config(ProviderKind::OpenAiResponses, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    assert_eq!(r.unwrap().message.text.as_deref(), Some("ok"));
    assert_eq!(seen[..2], ["retry:2:http 429", "retry:3:http 500"]);
    assert_eq!(server.requests().len(), 3);

    // A refused request: its message, never the key, and no retry.
    let server = FakeProvider::start().await;
    server.push(Reply::status(
        400,
        &json!({"error": {"message": format!("Invalid input from key {KEY}"),
            "type": "invalid_request_error", "param": "input", "code": null}})
        .to_string(),
    ));
    let c = config(ProviderKind::OpenAiResponses, &server);
    let (r, _) = call(&client(&c), &convo()).await;
    let e = r.unwrap_err();
    assert_eq!((e.kind, e.status), (ModelErrorKind::BadRequest, Some(400)));
    assert!(
        e.message.contains("Invalid input from key [redacted]"),
        "{e}"
    );
    assert!(!format!("{e:?}").contains(KEY));
    assert_eq!(server.requests().len(), 1);

    // Cut before `response.completed`: closed, broken or silent.
    let mut half = responses_text("Half");
    half.pop();
    server.push(Reply::named_sse(half.clone()));
    server.push(Reply::named_sse(half.clone()).ending(End::Abort));
    server.push(Reply::named_sse(half.clone()).ending(End::Hang));
    for kind in [
        ModelErrorKind::Interrupted,
        ModelErrorKind::Interrupted,
        ModelErrorKind::IdleTimeout,
    ] {
        let (r, seen) = call(&client(&c), &convo()).await;
        assert_eq!(r.unwrap_err().kind, kind);
        assert_eq!(seen, vec!["text:Half"]);
    }
    assert_eq!(server.requests().len(), 4, "never re-sent once begun");

    // An error event, and a failed response, mid-stream.
    let mut errored = half.clone();
    errored.push(rev(
        json!({"type": "error", "sequence_number": 3, "code": "server_error",
        "message": "The model crashed", "param": null}),
    ));
    server.push(Reply::named_sse(errored));
    let mut failed = half;
    failed.push(rev(json!({"type": "response.failed", "sequence_number": 3,
        "response": {"id": "resp_1", "status": "failed",
            "error": {"code": "server_error", "message": "The response failed"}}})));
    server.push(Reply::named_sse(failed));
    for msg in ["The model crashed", "The response failed"] {
        let (r, _) = call(&client(&c), &convo()).await;
        let e = r.unwrap_err();
        assert_eq!(e.kind, ModelErrorKind::StreamError);
        assert!(e.message.contains(msg), "{e}");
    }
}

/// One Gemini chunk: the first candidate's parts, its finish reason and
/// the usage so far.
fn gchunk(parts: Value, finish: Option<&str>, usage: Value) -> String {
    let mut candidate = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
    if let Some(f) = finish {
        candidate["finishReason"] = json!(f);
    }
    json!({"candidates": [candidate], "usageMetadata": usage,
        "modelVersion": "gemini-2.5-flash", "responseId": "resp-1"})
    .to_string()
}

/// Thoughts, text in two pieces, a signed call without an id and a call
/// with one.
fn gemini_stream() -> Vec<String> {
    let early =
        json!({"promptTokenCount": 1200, "totalTokenCount": 1210, "thoughtsTokenCount": 10});
    vec![
        gchunk(
            json!([{"text": "The user wants ", "thought": true}]),
            None,
            early.clone(),
        ),
        gchunk(
            json!([{"text": "two files.", "thought": true}]),
            None,
            early.clone(),
        ),
        gchunk(json!([{"text": "Reading "}]), None, early.clone()),
        gchunk(json!([{"text": "both."}]), None, early),
        gchunk(
            json!([
                {"functionCall": {"name": "read", "args": {"path": "a.txt"}}, "thoughtSignature": "c2lnLWE="},
                {"functionCall": {"id": "fc-7", "name": "read", "args": {"path": "b.txt"}}}
            ]),
            Some("STOP"),
            json!({"promptTokenCount": 1200, "candidatesTokenCount": 40, "totalTokenCount": 1300,
                "cachedContentTokenCount": 1000, "thoughtsTokenCount": 60,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 1200}]}),
        ),
    ]
}

fn gemini_parts() -> Value {
    json!([
        {"text": "The user wants two files.", "thought": true},
        {"text": "Reading both."},
        {"functionCall": {"name": "read", "args": {"path": "a.txt"}}, "thoughtSignature": "c2lnLWE="},
        {"functionCall": {"id": "fc-7", "name": "read", "args": {"path": "b.txt"}}}
    ])
}

#[tokio::test]
async fn gemini_streams_thoughts_text_and_calls_and_sends_signatures_back() {
    let server = FakeProvider::start().await;
    server.push(Reply::sse(gemini_stream()));
    let mut c = config(ProviderKind::Gemini, &server);
    c.max_tokens = Some(1000);
    c.temperature = Some(0.2);
    let m = client(&c);
    let (r, seen) = call(&m, &convo()).await;
    let r = r.expect("answer");
    assert_eq!(r.message.text.as_deref(), Some("Reading both."));
    assert_eq!(
        r.message.reasoning.as_deref(),
        Some("The user wants two files.")
    );
    assert_eq!(
        r.message.tool_calls,
        vec![
            ToolCall {
                id: "call_0".into(),
                name: "read".into(),
                args: "{\"path\":\"a.txt\"}".into()
            },
            ToolCall {
                id: "fc-7".into(),
                name: "read".into(),
                args: "{\"path\":\"b.txt\"}".into()
            },
        ]
    );
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        r.message.provider_data,
        Some(json!({"parts": gemini_parts()}))
    );
    // The last usage wins; the output is the answer's and the thoughts'.
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (1200, 100));
    assert_eq!(r.usage.cache_read_tokens, Some(1000));
    assert_eq!(r.usage.reasoning_tokens, Some(60));
    // gemini-2.5-flash: 200 full input tokens at 0.30, 1000 cached at 0.075, 100 out at 2.50.
    let cost = r.cost_usd.expect("priced");
    assert!(
        (cost - (200.0 * 0.30 + 1000.0 * 0.075 + 100.0 * 2.50) / 1e6).abs() < 1e-12,
        "{cost}"
    );
    assert_eq!(
        seen,
        vec![
            "reasoning:The user wants ",
            "reasoning:two files.",
            "text:Reading ",
            "text:both."
        ]
    );

    let req = &server.requests()[0];
    assert_eq!(
        req.path,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    );
    assert_eq!(req.query, "alt=sse");
    assert_eq!(req.header("x-goog-api-key"), Some(KEY));
    assert_eq!(req.header("authorization"), None);
    let body = &req.body;
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}]})
    );
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "parts": [{"text": "Read a.txt"}]}])
    );
    assert_eq!(
        body["tools"],
        json!([{"functionDeclarations": [{"name": "read", "description": "Read a file",
            "parametersJsonSchema": tools()[0].parameters}]}])
    );
    assert_eq!(
        body["generationConfig"],
        json!({"maxOutputTokens": 1000, "temperature": 0.2})
    );

    // The next request sends the turn's parts back exactly, signature on
    // its part, and the results as the user's function responses. Its
    // answer ends with the signature alone on an empty text part.
    server.push(Reply::sse([
        gchunk(
            json!([{"text": "Do"}]),
            None,
            json!({"promptTokenCount": 1400}),
        ),
        gchunk(
            json!([{"text": "ne."}]),
            None,
            json!({"promptTokenCount": 1400}),
        ),
        gchunk(
            json!([{"text": "", "thoughtSignature": "c2lnLWI="}]),
            Some("STOP"),
            json!({"promptTokenCount": 1400, "candidatesTokenCount": 2, "totalTokenCount": 1402}),
        ),
    ]));
    let next = after_tools(&r.message, ["call_0", "fc-7"]);
    let (r2, seen) = call(&m, &next).await;
    let r2 = r2.unwrap();
    assert_eq!(seen, vec!["text:Do", "text:ne."]);
    assert_eq!(r2.finish_reason, FinishReason::Stop);
    assert_eq!(r2.message.text.as_deref(), Some("Done."));
    assert_eq!(r2.usage.reasoning_tokens, None);
    assert_eq!(
        r2.message.provider_data,
        Some(json!({"parts": [{"text": "Done."}, {"text": "", "thoughtSignature": "c2lnLWI="}]}))
    );
    let body = &server.requests()[1].body;
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "Read a.txt"}]},
            {"role": "model", "parts": gemini_parts()},
            {"role": "user", "parts": [
                {"functionResponse": {"id": "call_0", "name": "read", "response": {"output": "hello"}}},
                {"functionResponse": {"id": "fc-7", "name": "read", "response": {"error": "error: no such file"}}}
            ]}
        ])
    );

    // Rebuilt from the log, the conversation gives the same bytes.
    let again = cairn_agent::gemini::Gemini::new(&c, KEY.into()).unwrap();
    let logged = after_tools(&as_logged(&r.message), ["call_0", "fc-7"]);
    let tools = tools();
    let req = |c| ModelRequest {
        conversation: c,
        tools: &tools,
        cache_key: None,
    };
    let bytes = serde_json::to_vec(&again.body(&req(&next))).unwrap();
    assert_eq!(
        bytes,
        serde_json::to_vec(&again.body(&req(&logged))).unwrap()
    );
    assert_eq!(bytes, serde_json::to_vec(body).unwrap());
}

#[tokio::test]
async fn gemini_rebuilds_a_turn_it_did_not_answer() {
    let server = FakeProvider::start().await;
    let c = config(ProviderKind::Gemini, &server);
    let g = cairn_agent::gemini::Gemini::new(&c, KEY.into()).unwrap();
    let mut conversation = convo();
    conversation
        .messages
        .push(Message::Assistant(AssistantMessage {
            text: Some("Reading.".into()),
            reasoning: Some("thinking elsewhere".into()),
            tool_calls: vec![
                ToolCall {
                    id: "toolu_1".into(),
                    name: "read".into(),
                    args: "{\"path\": \"a.txt\"}".into(),
                },
                ToolCall {
                    id: "toolu_2".into(),
                    name: "read".into(),
                    args: "{\"path\": ".into(),
                },
            ],
            provider_data: Some(json!({"thinking": [{"type": "thinking", "signature": "x"}]})),
        }));
    let req = ModelRequest {
        conversation: &conversation,
        tools: &[],
        cache_key: None,
    };
    let body = g.body(&req);
    assert_eq!(
        body["contents"][1],
        json!({"role": "model", "parts": [
            {"text": "Reading."},
            {"functionCall": {"name": "read", "args": {"path": "a.txt"}}},
            {"functionCall": {"name": "read", "args": {}}}
        ]})
    );
    assert!(body.get("tools").is_none() && body.get("generationConfig").is_none());
}

#[tokio::test]
async fn gemini_finish_reasons_and_a_blocked_prompt() {
    let server = FakeProvider::start().await;
    let usage = json!({"promptTokenCount": 5, "candidatesTokenCount": 1});
    server.push(Reply::sse([gchunk(
        json!([{"text": "Hal"}]),
        Some("MAX_TOKENS"),
        usage.clone(),
    )]));
    server.push(Reply::sse([gchunk(
        json!([]),
        Some("SAFETY"),
        usage.clone(),
    )]));
    server.push(Reply::sse([gchunk(
        json!([{"text": "x"}]),
        Some("MALFORMED_FUNCTION_CALL"),
        usage,
    )]));
    server.push(Reply::sse([
        json!({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
        "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7}})
        .to_string(),
    ]));
    let c = config(ProviderKind::Gemini, &server);
    let m = client(&c);
    for want in [
        FinishReason::MaxTokens,
        FinishReason::ContentFilter,
        FinishReason::Other("MALFORMED_FUNCTION_CALL".into()),
        FinishReason::ContentFilter,
    ] {
        let (r, _) = call(&m, &convo()).await;
        assert_eq!(r.unwrap().finish_reason, want);
    }
}

#[tokio::test]
async fn gemini_retries_errors_and_cut_streams() {
    let server = FakeProvider::start().await;
    // 429 with the wait it asks for, then a 500, then the answer.
    server.push(
        Reply::status(
            429,
            r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}"#,
        )
        .header("retry-after", "0"),
    );
    server.push(Reply::status(
        500,
        r#"{"error":{"code":500,"message":"An internal error has occurred.","status":"INTERNAL"}}"#,
    ));
    server.push(Reply::sse([gchunk(
        json!([{"text": "ok"}]),
        Some("STOP"),
        json!({"promptTokenCount": 3, "candidatesTokenCount": 1}),
    )]));
    let c = config(ProviderKind::Gemini, &server);
    let (r, seen) = call(&client(&c), &convo()).await;
    assert_eq!(r.unwrap().message.text.as_deref(), Some("ok"));
    assert_eq!(seen[..2], ["retry:2:http 429", "retry:3:http 500"]);
    assert_eq!(server.requests().len(), 3);

    // A refused request (Google's APIs may wrap the error in an array): its
    // message, never the key, and no retry.
    let server = FakeProvider::start().await;
    server.push(Reply::status(
        400,
        &json!([{"error": {"code": 400, "message": format!("API key not valid: {KEY}"),
            "status": "INVALID_ARGUMENT"}}])
        .to_string(),
    ));
    let c = config(ProviderKind::Gemini, &server);
    let (r, _) = call(&client(&c), &convo()).await;
    let e = r.unwrap_err();
    assert_eq!((e.kind, e.status), (ModelErrorKind::BadRequest, Some(400)));
    assert!(e.message.contains("API key not valid: [redacted]"), "{e}");
    assert!(!format!("{e:?}").contains(KEY));
    assert_eq!(server.requests().len(), 1);

    // Cut before any `finishReason`: closed, broken or silent.
    let half = gchunk(
        json!([{"text": "Half"}]),
        None,
        json!({"promptTokenCount": 3}),
    );
    server.push(Reply::sse([half.clone()]));
    server.push(Reply::sse([half.clone()]).ending(End::Abort));
    server.push(Reply::sse([half.clone()]).ending(End::Hang));
    for kind in [
        ModelErrorKind::Interrupted,
        ModelErrorKind::Interrupted,
        ModelErrorKind::IdleTimeout,
    ] {
        let (r, seen) = call(&client(&c), &convo()).await;
        let e = r.unwrap_err();
        assert_eq!(e.kind, kind, "{e}");
        assert_eq!(seen, vec!["text:Half"]);
    }
    assert_eq!(server.requests().len(), 4, "never re-sent once begun");

    // An error chunk mid-stream.
    server.push(Reply::sse([
        half,
        json!({"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}})
            .to_string(),
    ]));
    let (r, _) = call(&client(&c), &convo()).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ModelErrorKind::StreamError);
    assert!(e.message.contains("The model is overloaded."), "{e}");
    assert!(e.message.contains("UNAVAILABLE"), "{e}");
}

#[test]
fn the_new_providers_read_their_keys_from_their_variables() {
    for (p, var) in [
        (ProviderKind::OpenAiResponses, "OPENAI_API_KEY"),
        (ProviderKind::Gemini, "GEMINI_API_KEY"),
    ] {
        let mut c = ModelConfig::new(p, "m");
        c.api_key_env = Some("CAIRN_TEST_NO_SUCH_KEY".into());
        let e = client_for(&c, None).err().expect("no key");
        assert_eq!(e.kind, ModelErrorKind::Auth);
        assert_eq!(p.default_key_env(), Some(var));
    }
}

#[tokio::test]
async fn openai_requests_carry_the_conversations_cache_key() {
    let server = FakeProvider::start().await;
    let c = config(ProviderKind::OpenAi, &server);
    let tools = tools();
    let conversation = convo();
    let req = ModelRequest {
        conversation: &conversation,
        tools: &tools,
        cache_key: Some("cairn-0123"),
    };
    let on = cairn_agent::openai::OpenAi::new(&c, KEY.into()).unwrap();
    assert_eq!(on.body(&req)["prompt_cache_key"], "cairn-0123");
    let mut off = c.clone();
    off.prompt_cache = Some(false);
    let off = cairn_agent::openai::OpenAi::new(&off, KEY.into()).unwrap();
    assert!(off.body(&req).get("prompt_cache_key").is_none());
}
