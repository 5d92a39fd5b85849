//! Making a conversation fit its model's context window.
//!
//! Before a step's request would hold more than the window leaves beside
//! the answer, the conversation is made shorter, cheapest first: the
//! older tools' results are cut (`truncate-tool-results`), then, if that
//! is not enough, the older turns are summarised by the model itself
//! (`summarize`), the summary joining the first message. Each is logged as
//! `AgentContextCompacted` before the step it came before; both are pure
//! functions of the conversation (and, for a summary, of the logged
//! text), so a conversation taken up again after a crash replays them and
//! rebuilds exactly what the model was sent.

use cairn_agent::{Conversation, Message};

/// `AgentContextCompacted.strategy` of a cut of old tool results.
pub(super) const TRUNCATE: &str = "truncate-tool-results";

/// `AgentContextCompacted.strategy` of a summary of old turns.
pub(super) const SUMMARIZE: &str = "summarize";

/// Results at most this long are never cut.
const RESULT_KEEP: usize = 1024;

/// What is kept of a cut result.
const RESULT_HEAD: usize = 512;

/// The turns (an answer and its tools' results) kept whole by a summary.
const KEEP_TURNS: usize = 2;

/// What separates the task from the summary in the first message.
const SUMMARY_MARK: &str = "\n\n---\nWhat happened so far (older turns of this conversation, \
                            summarised to fit the context window):\n";

/// The instructions of the model call that summarises.
pub(super) const SUMMARY_SYSTEM: &str = "You compress an AI agent's working conversation so it \
    can continue with less context. Write a faithful, dense summary of the transcript you are \
    given: what was asked, what was found (file paths, names, numbers, errors, decisions), which \
    tool calls were made and what they changed, and what remains to do. Keep facts, drop \
    pleasantries. Answer with the summary alone.";

/// The tokens a request may hold: the window less room for the answer.
pub(super) fn budget(window: u64, max_tokens: Option<u32>) -> u64 {
    let room = max_tokens.map_or(4096, u64::from).min(window / 4);
    window - room
}

/// Cuts every tool result but the latest turn's that is longer than
/// [`RESULT_KEEP`] to its head, saying so to the model. Returns whether
/// anything was cut.
pub(super) fn truncate_tool_results(convo: &mut Conversation) -> bool {
    let latest = convo
        .messages
        .iter()
        .rposition(|m| matches!(m, Message::ToolResults(_)));
    let mut cut_any = false;
    for (i, m) in convo.messages.iter_mut().enumerate() {
        let Message::ToolResults(results) = m else {
            continue;
        };
        if Some(i) == latest {
            continue;
        }
        for r in results {
            if r.content.len() > RESULT_KEEP {
                let total = r.content.len();
                let head = floor_char(&r.content, RESULT_HEAD);
                r.content = format!(
                    "{}\n… [Cairn cut this result from {total} bytes to fit the context window; \
                     call the tool again if you need the rest]",
                    &r.content[..head]
                );
                cut_any = true;
            }
        }
    }
    cut_any
}

/// Where the older turns a summary replaces end: the first message of the
/// last [`KEEP_TURNS`] turns, or `None` when there is nothing older than
/// them to summarise.
pub(super) fn summary_cut(convo: &Conversation) -> Option<usize> {
    let answers: Vec<usize> = convo
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, Message::Assistant(_)))
        .map(|(i, _)| i)
        .collect();
    let cut = *answers.get(answers.len().checked_sub(KEEP_TURNS)?)?;
    (cut > 1).then_some(cut)
}

/// The text the summarising call reads: the earlier summary (if any) and
/// the turns it replaces, each message cut to a few kilobytes and the
/// whole to `max_bytes`, the most recent kept.
pub(super) fn transcript(convo: &Conversation, task: &str, cut: usize, max_bytes: usize) -> String {
    const EACH: usize = 4096;
    let mut parts: Vec<String> = Vec::new();
    if let Some(Message::User { text }) = convo.messages.first() {
        if let Some(earlier) = text
            .strip_prefix(task)
            .and_then(|r| r.strip_prefix(SUMMARY_MARK))
        {
            parts.push(format!(
                "[summary of what came before]\n{}",
                clip(earlier, EACH * 2)
            ));
        }
    }
    for m in &convo.messages[1..cut] {
        parts.push(match m {
            Message::User { text } => format!("[user]\n{}", clip(text, EACH)),
            Message::Assistant(a) => {
                let mut s = String::from("[assistant]\n");
                if let Some(t) = &a.text {
                    s.push_str(&clip(t, EACH));
                    s.push('\n');
                }
                for c in &a.tool_calls {
                    s.push_str(&format!("calls {}({})\n", c.name, clip(&c.args, 512)));
                }
                s
            }
            Message::ToolResults(rs) => rs
                .iter()
                .map(|r| {
                    let err = if r.is_error { " (error)" } else { "" };
                    format!("[result of {}{err}]\n{}", r.name, clip(&r.content, EACH))
                })
                .collect::<Vec<_>>()
                .join("\n"),
        });
    }
    // The most recent parts matter most: the oldest go first.
    let mut total: usize = parts.iter().map(|p| p.len() + 1).sum();
    let mut skip = 0;
    while total > max_bytes && skip < parts.len() {
        total -= parts[skip].len() + 1;
        skip += 1;
    }
    let mut out = String::new();
    if skip > 0 {
        out.push_str(&format!("[{skip} older parts left out]\n"));
    }
    out.push_str(&parts[skip..].join("\n"));
    out
}

/// The conversation with its older turns (before `cut`) replaced by
/// `summary`, which joins the task in the first message.
pub(super) fn apply_summary(convo: &mut Conversation, task: &str, cut: usize, summary: &str) {
    let tail = convo.messages.split_off(cut);
    convo.messages = vec![Message::User {
        text: format!("{task}{SUMMARY_MARK}{summary}"),
    }];
    convo.messages.extend(tail);
}

/// `s` cut to at most `max` bytes, marked when cut.
fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    format!("{}…", &s[..floor_char(s, max)])
}

/// The largest char boundary of `s` at or before `i`.
fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_agent::{AssistantMessage, ToolCall, ToolResult};

    fn turn(n: usize, result: &str) -> [Message; 2] {
        [
            Message::Assistant(AssistantMessage {
                text: Some(format!("step {n}")),
                tool_calls: vec![ToolCall {
                    id: format!("c{n}"),
                    name: "read".into(),
                    args: "{}".into(),
                }],
                ..AssistantMessage::default()
            }),
            Message::ToolResults(vec![ToolResult {
                call_id: format!("c{n}"),
                name: "read".into(),
                content: result.to_string(),
                is_error: false,
            }]),
        ]
    }

    fn convo(turns: usize, result: &str) -> Conversation {
        let mut c = Conversation {
            system: None,
            messages: vec![Message::User {
                text: "task".into(),
            }],
        };
        for n in 0..turns {
            c.messages.extend(turn(n, result));
        }
        c
    }

    #[test]
    fn old_results_are_cut_and_the_latest_kept() {
        let long = "é".repeat(2000);
        let mut c = convo(3, &long);
        assert!(truncate_tool_results(&mut c));
        let contents: Vec<usize> = c
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::ToolResults(r) => Some(r[0].content.len()),
                _ => None,
            })
            .collect();
        assert!(contents[0] < 700 && contents[1] < 700, "{contents:?}");
        assert_eq!(contents[2], long.len());
        // Cutting again changes nothing.
        assert!(!truncate_tool_results(&mut c));
    }

    #[test]
    fn a_summary_replaces_all_but_the_last_turns_and_is_summarised_again() {
        let mut c = convo(5, "x");
        let cut = summary_cut(&c).unwrap();
        assert_eq!(cut, 1 + 2 * 3);
        let text = transcript(&c, "task", cut, 1 << 20);
        assert!(text.contains("step 0") && text.contains("step 2") && !text.contains("step 3"));
        apply_summary(&mut c, "task", cut, "S1");
        assert_eq!(c.messages.len(), 1 + 2 * 2);
        assert!(
            matches!(&c.messages[1], Message::Assistant(a) if a.text.as_deref() == Some("step 3"))
        );
        // Nothing older than the kept turns: no second summary yet.
        assert_eq!(summary_cut(&c), None);
        c.messages.extend(turn(5, "y"));
        let cut = summary_cut(&c).unwrap();
        let text = transcript(&c, "task", cut, 1 << 20);
        assert!(
            text.starts_with("[summary of what came before]\nS1"),
            "{text}"
        );
        apply_summary(&mut c, "task", cut, "S2");
        let Message::User { text } = &c.messages[0] else {
            panic!()
        };
        assert!(text.starts_with("task") && text.ends_with("S2") && !text.contains("S1"));
        // A transcript over its bound keeps the latest parts.
        let big = convo(30, &"z".repeat(3000));
        let cut = summary_cut(&big).unwrap();
        let t = transcript(&big, "task", cut, 10_000);
        assert!(
            t.len() <= 10_100 && t.starts_with('[') && t.contains("step 27"),
            "{}",
            t.len()
        );
    }

    #[test]
    fn the_budget_leaves_room_for_the_answer() {
        assert_eq!(budget(200_000, None), 200_000 - 4096);
        assert_eq!(budget(2000, Some(1000)), 1500);
    }
}
