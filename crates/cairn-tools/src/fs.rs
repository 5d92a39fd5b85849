//! `read` and `write`.

use std::io::{BufRead, BufReader, Read};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::error::ToolError;
use crate::sandbox::io_path_err;
use crate::tool::{Args, Tool, ToolContext, ToolSpec};

/// `read {path, from_line?, to_line?}`: a file's text, or a 1-based inclusive
/// range of its lines. Returns `{path, content, lines}`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadTool;

#[async_trait::async_trait]
impl Tool for ReadTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read".into(),
            side_effect: false,
            idempotent: true,
            description: "Read a text file inside the sandbox, optionally a range of lines.".into(),
            args_schema: json!({
                "type": "object",
                "required": ["path"],
                "additionalProperties": false,
                "properties": {
                    "path": {"type": "string"},
                    "from_line": {"type": "integer", "minimum": 1},
                    "to_line": {"type": "integer", "minimum": 1}
                }
            }),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<Value, ToolError> {
        let a = Args::new("read", &args, &["path", "from_line", "to_line"])?;
        let path = a.str("path")?;
        let from = a.opt_u64("from_line")?;
        let to = a.opt_u64("to_line")?;
        if from == Some(0) {
            return Err(a.err("from_line", "lines count from 1"));
        }
        if to == Some(0) {
            return Err(a.err("to_line", "lines count from 1"));
        }
        if let (Some(f), Some(t)) = (from, to) {
            if f > t {
                return Err(a.err("to_line", format!("{t} is before from_line {f}")));
            }
        }
        let limit = ctx.sandbox.limits().max_output_bytes;
        let (file, rel) = ctx.sandbox.open_file(path)?;
        let ranged = from.is_some() || to.is_some();
        if !ranged {
            let size = file.metadata().map_err(|e| io_path_err(path, e))?.len();
            if size > limit as u64 {
                return Err(ToolError::TooLarge {
                    what: format!("file `{path}`"),
                    size,
                    limit: limit as u64,
                });
            }
        }
        let from = from.unwrap_or(1);
        let to = to.unwrap_or(u64::MAX);
        let path_owned = path.to_string();
        // Blocking reads belong off the async workers.
        let (content, lines) =
            tokio::task::spawn_blocking(move || read_lines(file, from, to, limit, &path_owned))
                .await
                .map_err(|e| ToolError::Other(format!("read task failed: {e}")))??;
        Ok(json!({
            "path": rel.to_string_lossy(),
            "content": content,
            "lines": lines,
        }))
    }
}

/// Lines `from..=to` (1-based) of `file`, refusing more than `limit` bytes.
fn read_lines(
    file: std::fs::File,
    from: u64,
    to: u64,
    limit: usize,
    path: &str,
) -> Result<(String, u64), ToolError> {
    let mut reader = BufReader::new(file);
    let mut out: Vec<u8> = Vec::new();
    let mut line = Vec::new();
    let mut n = 0u64;
    let mut taken = 0u64;
    while n < to {
        line.clear();
        // Bound a single line too, so a huge line cannot blow memory.
        let read = (&mut reader)
            .take(limit as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| ToolError::io(format!("reading `{path}`"), e))?;
        if read == 0 {
            break;
        }
        if line.len() > limit && line.last() != Some(&b'\n') {
            return Err(ToolError::TooLarge {
                what: format!("line {} of `{path}`", n + 1),
                size: line.len() as u64,
                limit: limit as u64,
            });
        }
        n += 1;
        if n >= from {
            if out.len() + line.len() > limit {
                return Err(ToolError::TooLarge {
                    what: format!("the requested lines of `{path}`"),
                    size: (out.len() + line.len()) as u64,
                    limit: limit as u64,
                });
            }
            out.extend_from_slice(&line);
            taken += 1;
        }
    }
    let content = match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    Ok((content, taken))
}

/// `write {path, content}`: creates or replaces a file, making parent
/// folders. Returns `{path, bytes, sha256}`; the content itself is not echoed,
/// so the call's record keeps its hash and size only.
#[derive(Debug, Default, Clone, Copy)]
pub struct WriteTool;

#[async_trait::async_trait]
impl Tool for WriteTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "write".into(),
            side_effect: true,
            idempotent: false,
            description: "Create or replace a file inside the sandbox, making parent folders."
                .into(),
            args_schema: json!({
                "type": "object",
                "required": ["path", "content"],
                "additionalProperties": false,
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"}
                }
            }),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<Value, ToolError> {
        let a = Args::new("write", &args, &["path", "content"])?;
        let path = a.str("path")?;
        let content = a.str("content")?;
        let limit = ctx.sandbox.limits().max_output_bytes;
        if content.len() > limit {
            return Err(ToolError::TooLarge {
                what: "content".into(),
                size: content.len() as u64,
                limit: limit as u64,
            });
        }
        let rel = ctx.sandbox.relative(path)?;
        let (dir, name) = ctx.sandbox.open_parent(path, &rel, true)?;
        ctx.sandbox
            .replace_file(path, &dir, &name, content.as_bytes())?;
        Ok(json!({
            "path": rel.to_string_lossy(),
            "bytes": content.len(),
            "sha256": hex::encode(Sha256::digest(content.as_bytes())),
        }))
    }
}
