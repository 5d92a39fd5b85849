//! Server-sent events, read incrementally from a body's chunks with a
//! bound on every line, so that a hostile or broken server cannot make
//! Cairn buffer without end (eventsource-stream does not bound a line).

/// Longest line (and so longest event `data`) kept: 1 MiB.
pub const MAX_LINE: usize = 1 << 20;

/// One event: its `event:` name (empty when absent) and its `data:` lines
/// joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The event's name.
    pub event: String,
    /// The event's data.
    pub data: String,
}

/// An event's field was longer than [`MAX_LINE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineTooLong;

/// Splits a byte stream into events.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: SseEvent,
    has_data: bool,
    /// The last byte seen was `\r`, so a following `\n` ends nothing.
    after_cr: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Feeds a chunk; the events it completes are pushed to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), LineTooLong> {
        for &b in chunk {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    self.take_line(&line, out)?;
                }
                _ => {
                    if self.line.len() >= MAX_LINE {
                        return Err(LineTooLong);
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(())
    }

    fn take_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), LineTooLong> {
        if line.is_empty() {
            if self.has_data {
                out.push(std::mem::take(&mut self.event));
            } else {
                self.event = SseEvent::default();
            }
            self.has_data = false;
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(()); // a comment (keep-alive)
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (&*text, ""),
        };
        match field {
            "event" => self.event.event = value.to_string(),
            "data" => {
                if self.has_data {
                    if self.event.data.len() + value.len() + 1 > MAX_LINE {
                        return Err(LineTooLong);
                    }
                    self.event.data.push('\n');
                }
                self.event.data.push_str(value);
                self.has_data = true;
            }
            _ => {} // id, retry: nothing to do with them here
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out).unwrap();
        }
        out
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let all = parse(&[
            b"event: a\nda",
            b"ta: {\"x\":",
            b" 1}\n\n: ping\n\ndata: [DONE]\r\n\r\n",
        ]);
        assert_eq!(
            all,
            vec![
                SseEvent {
                    event: "a".into(),
                    data: "{\"x\": 1}".into()
                },
                SseEvent {
                    event: String::new(),
                    data: "[DONE]".into()
                },
            ]
        );
    }

    #[test]
    fn data_lines_join_and_a_line_is_bounded() {
        assert_eq!(parse(&[b"data: a\ndata: b\n\n"])[0].data, "a\nb");
        let mut p = SseParser::new();
        let big = vec![b'x'; MAX_LINE + 1];
        assert_eq!(p.feed(&big, &mut Vec::new()), Err(LineTooLong));
    }
}
