//! `edit`: applies a unified diff to one existing file.
//!
//! Hunks are applied in order against the original text. A hunk is placed at
//! its stated line if its context and removed lines match there, otherwise at
//! the nearest later position where they match (as `patch` does with offsets,
//! without fuzz: every context line must match exactly). A hunk that matches
//! nowhere fails the whole edit, naming the hunk and the first line that
//! differs at its stated position; the file is then left untouched, and when
//! every hunk applies the new text replaces the file through a temporary file
//! and a rename.

use std::io::Read;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::error::ToolError;
use crate::tool::{Args, Tool, ToolContext, ToolSpec};

/// `edit {path, patch}`. Returns `{path, hunks, bytes, sha256}`.
#[derive(Debug, Default, Clone, Copy)]
pub struct EditTool;

#[async_trait::async_trait]
impl Tool for EditTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "edit".into(),
            side_effect: true,
            idempotent: false,
            description: "Apply a unified diff to an existing file inside the sandbox.".into(),
            args_schema: json!({
                "type": "object",
                "required": ["path", "patch"],
                "additionalProperties": false,
                "properties": {
                    "path": {"type": "string"},
                    "patch": {"type": "string", "description": "unified diff (---/+++ headers optional)"}
                }
            }),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<Value, ToolError> {
        let a = Args::new("edit", &args, &["path", "patch"])?;
        let path = a.str("path")?;
        let patch_text = a.str("patch")?;
        let hunks = parse_patch(patch_text)?;
        if hunks.is_empty() {
            return Err(a.err("patch", "contains no hunk (no `@@ -a,b +c,d @@` line)"));
        }
        let limit = ctx.sandbox.limits().max_output_bytes;
        let (mut file, rel) = ctx.sandbox.open_file(path)?;
        let size = file
            .metadata()
            .map_err(|e| ToolError::io(format!("reading `{path}`"), e))?
            .len();
        if size > limit as u64 {
            return Err(ToolError::TooLarge {
                what: format!("file `{path}`"),
                size,
                limit: limit as u64,
            });
        }
        let mut original = String::new();
        file.read_to_string(&mut original)
            .map_err(|e| ToolError::io(format!("reading `{path}` (edit needs UTF-8 text)"), e))?;
        drop(file);
        let updated = apply_patch(&original, &hunks, path)?;
        if updated.len() > limit {
            return Err(ToolError::TooLarge {
                what: format!("the edited `{path}`"),
                size: updated.len() as u64,
                limit: limit as u64,
            });
        }
        let (dir, name) = ctx.sandbox.open_parent(path, &rel, false)?;
        ctx.sandbox
            .replace_file(path, &dir, &name, updated.as_bytes())?;
        Ok(json!({
            "path": rel.to_string_lossy(),
            "hunks": hunks.len(),
            "bytes": updated.len(),
            "sha256": hex::encode(Sha256::digest(updated.as_bytes())),
        }))
    }
}

/// One line of a hunk body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HunkLine {
    /// Present before and after.
    Context(String),
    /// Removed.
    Remove(String),
    /// Added.
    Add(String),
}

/// One `@@` section of a unified diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// The `@@ ... @@` line as written.
    pub header: String,
    /// 1-based first old line (0 when the old range is empty).
    pub old_start: usize,
    /// Number of old lines.
    pub old_len: usize,
    /// Number of new lines.
    pub new_len: usize,
    /// The body.
    pub lines: Vec<HunkLine>,
    /// The old side ends without a newline at end of file.
    pub old_no_eol: bool,
    /// The new side ends without a newline at end of file.
    pub new_no_eol: bool,
}

fn patch_err(line: usize, message: impl Into<String>) -> ToolError {
    ToolError::Patch {
        line,
        message: message.into(),
    }
}

/// Parses `-a,b +c,d` out of a hunk header.
fn parse_range(s: &str, sign: char, line: usize) -> Result<(usize, usize), ToolError> {
    let body = s.strip_prefix(sign).ok_or_else(|| {
        patch_err(
            line,
            format!("hunk header range `{s}` should start with `{sign}`"),
        )
    })?;
    let (start, len) = match body.split_once(',') {
        Some((a, b)) => (a, Some(b)),
        None => (body, None),
    };
    let num = |t: &str| {
        t.parse::<usize>()
            .map_err(|_| patch_err(line, format!("`{t}` in hunk header is not a line number")))
    };
    Ok((num(start)?, len.map(num).transpose()?.unwrap_or(1)))
}

/// Parses a unified diff for one file into hunks.
pub fn parse_patch(text: &str) -> Result<Vec<Hunk>, ToolError> {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut hunks: Vec<Hunk> = Vec::new();
    let mut i = 0;
    let mut seen_file_header = false;
    while i < lines.len() {
        let raw = lines[i];
        let no = i + 1;
        if let Some(rest) = raw.strip_prefix("@@ ") {
            let mut hunk = hunk_header(raw, rest, no)?;
            i += 1;
            let (old_seen, new_seen) = hunk_body(&lines, &mut i, &mut hunk)?;
            if old_seen != hunk.old_len || new_seen != hunk.new_len {
                return Err(patch_err(
                    no,
                    format!(
                        "hunk {} (`{}`) announces {} old and {} new lines but its body has {old_seen} and {new_seen}",
                        hunks.len() + 1,
                        hunk.header,
                        hunk.old_len,
                        hunk.new_len,
                    ),
                ));
            }
            // A trailing "\ No newline" after the counts are met.
            if i < lines.len() && lines[i].starts_with('\\') {
                i += 1;
            }
            hunks.push(hunk);
            continue;
        }
        outside_hunk(raw, no, &mut seen_file_header, !hunks.is_empty())?;
        i += 1;
    }
    Ok(hunks)
}

/// A hunk's header line (`@@ -a,b +c,d @@`; `rest` follows its `@@ `), as
/// a hunk with no lines yet.
fn hunk_header(raw: &str, rest: &str, no: usize) -> Result<Hunk, ToolError> {
    let end = rest
        .find(" @@")
        .ok_or_else(|| patch_err(no, "hunk header lacks its closing `@@`"))?;
    let mut parts = rest[..end].split_whitespace();
    let (old_start, old_len) = parse_range(parts.next().unwrap_or(""), '-', no)?;
    let (_, new_len) = parse_range(parts.next().unwrap_or(""), '+', no)?;
    Ok(Hunk {
        header: raw.trim_end().to_string(),
        old_start,
        old_len,
        new_len,
        lines: Vec::new(),
        old_no_eol: false,
        new_no_eol: false,
    })
}

/// Reads a hunk's lines from `lines[*i]` until its counts are met or the
/// next hunk begins; returns how many old and new lines it read.
fn hunk_body(lines: &[&str], i: &mut usize, hunk: &mut Hunk) -> Result<(usize, usize), ToolError> {
    let (mut old_seen, mut new_seen) = (0usize, 0usize);
    while *i < lines.len() && (old_seen < hunk.old_len || new_seen < hunk.new_len) {
        let l = lines[*i];
        // The last element after the final '\n' is not a line.
        if *i == lines.len() - 1 && l.is_empty() {
            break;
        }
        if l.starts_with("@@ ") {
            break;
        }
        match l.as_bytes().first() {
            Some(b' ') => {
                hunk.lines.push(HunkLine::Context(l[1..].to_string()));
                old_seen += 1;
                new_seen += 1;
            }
            // Editors and models often strip the lone space of an
            // empty context line.
            None => {
                hunk.lines.push(HunkLine::Context(String::new()));
                old_seen += 1;
                new_seen += 1;
            }
            Some(b'-') => {
                hunk.lines.push(HunkLine::Remove(l[1..].to_string()));
                old_seen += 1;
            }
            Some(b'+') => {
                hunk.lines.push(HunkLine::Add(l[1..].to_string()));
                new_seen += 1;
            }
            Some(b'\\') => {}
            _ => {
                return Err(patch_err(
                    *i + 1,
                    format!("`{l}` is not a hunk line (it should start with ' ', '-' or '+')"),
                ))
            }
        }
        *i += 1;
        // "\ No newline at end of file" marks the line just read.
        if *i < lines.len() && lines[*i].starts_with('\\') {
            match hunk.lines.last() {
                Some(HunkLine::Remove(_)) => hunk.old_no_eol = true,
                Some(HunkLine::Add(_)) => hunk.new_no_eol = true,
                Some(HunkLine::Context(_)) => {
                    hunk.old_no_eol = true;
                    hunk.new_no_eol = true;
                }
                None => {}
            }
            *i += 1;
        }
    }
    Ok((old_seen, new_seen))
}

/// A line outside any hunk: the file headers (refusing a patch that
/// creates, deletes or spans files) and git's own headers; anything else
/// after a hunk means its counts were wrong.
fn outside_hunk(
    raw: &str,
    no: usize,
    seen_file_header: &mut bool,
    after_hunk: bool,
) -> Result<(), ToolError> {
    if let (Some(name), false) = (raw.strip_prefix("--- "), *seen_file_header) {
        if name.trim_start().starts_with("/dev/null") {
            return Err(patch_err(
                no,
                "the patch creates a file; use `write` to create files",
            ));
        }
        *seen_file_header = true;
    } else if let Some(name) = raw.strip_prefix("+++ ") {
        if name.trim_start().starts_with("/dev/null") {
            return Err(patch_err(
                no,
                "the patch deletes the file, which `edit` does not do",
            ));
        }
    } else if raw.starts_with("--- ") && after_hunk {
        return Err(patch_err(
            no,
            "the patch touches more than one file; `edit` takes one file per call",
        ));
    } else if after_hunk && !raw.trim().is_empty() && !is_git_header(raw) {
        return Err(patch_err(
            no,
            format!("unexpected `{raw}` after a hunk (its line counts may be wrong)"),
        ));
    }
    Ok(())
}

fn is_git_header(l: &str) -> bool {
    [
        "diff ",
        "index ",
        "old mode",
        "new mode",
        "similarity",
        "rename ",
    ]
    .iter()
    .any(|p| l.starts_with(p))
}

/// Applies `hunks` to `original`, or explains which hunk does not fit.
pub fn apply_patch(original: &str, hunks: &[Hunk], path: &str) -> Result<String, ToolError> {
    let ends_with_nl = original.is_empty() || original.ends_with('\n');
    let body = original.strip_suffix('\n').unwrap_or(original);
    let file: Vec<&str> = if original.is_empty() {
        Vec::new()
    } else {
        body.split('\n').collect()
    };
    let mut out: Vec<String> = Vec::with_capacity(file.len() + 16);
    let mut next = 0usize; // first original line not yet copied
    let mut drift: isize = 0; // how far earlier hunks were found from their stated place
    let mut final_nl = ends_with_nl;
    for (index, hunk) in hunks.iter().enumerate() {
        let old: Vec<&str> = hunk
            .lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(s) | HunkLine::Remove(s) => Some(s.as_str()),
                HunkLine::Add(_) => None,
            })
            .collect();
        // An empty old range names the line after which to insert.
        let stated = if hunk.old_len == 0 {
            hunk.old_start
        } else {
            hunk.old_start.saturating_sub(1)
        };
        let expected = (stated as isize + drift).max(0) as usize;
        let fits = |p: usize| p + old.len() <= file.len() && file[p..p + old.len()] == old[..];
        let pos = if expected >= next && fits(expected) {
            Some(expected)
        } else {
            (next..=file.len().saturating_sub(old.len()))
                .filter(|&p| fits(p))
                .min_by_key(|&p| p.abs_diff(expected))
        };
        let Some(pos) = pos else {
            return Err(ToolError::Hunk {
                path: path.to_string(),
                index: index + 1,
                header: hunk.header.clone(),
                reason: mismatch_reason(&file, &old, expected.max(next)),
            });
        };
        drift = pos as isize - stated as isize;
        out.extend(file[next..pos].iter().map(|s| s.to_string()));
        for l in &hunk.lines {
            match l {
                HunkLine::Context(s) | HunkLine::Add(s) => out.push(s.clone()),
                HunkLine::Remove(_) => {}
            }
        }
        next = pos + old.len();
        if next == file.len() {
            final_nl = !hunk.new_no_eol;
        }
    }
    out.extend(file[next..].iter().map(|s| s.to_string()));
    let mut text = out.join("\n");
    if final_nl && !out.is_empty() {
        text.push('\n');
    }
    Ok(text)
}

/// The first line where the hunk's old side differs from the file at `at`.
fn mismatch_reason(file: &[&str], old: &[&str], at: usize) -> String {
    for (k, want) in old.iter().enumerate() {
        match file.get(at + k) {
            None => {
                return format!(
                    "the file has {} lines, the hunk expects `{}` at line {} (and found it nowhere else after the previous hunk)",
                    file.len(),
                    clip(want),
                    at + k + 1
                )
            }
            Some(have) if have != want => {
                return format!(
                    "line {} is `{}` but the hunk expects `{}` (and its lines match nowhere else after the previous hunk)",
                    at + k + 1,
                    clip(have),
                    clip(want)
                )
            }
            _ => {}
        }
    }
    "its lines overlap the previous hunk".to_string()
}

fn clip(s: &str) -> String {
    const MAX: usize = 120;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_with_offset_and_keeps_missing_final_newline() {
        let orig = "a\nb\nc\nd\ne";
        let patch =
            "--- a/f\n+++ b/f\n@@ -3,3 +3,3 @@\n c\n-d\n+D\n e\n\\ No newline at end of file\n";
        let hunks = parse_patch(patch).unwrap();
        assert_eq!(apply_patch(orig, &hunks, "f").unwrap(), "a\nb\nc\nD\ne");
        // Same hunk stated two lines too early still applies (offset).
        let patch = "@@ -1,3 +1,3 @@\n c\n-d\n+D\n e\n";
        let hunks = parse_patch(patch).unwrap();
        assert_eq!(
            apply_patch("a\nb\nc\nd\ne\n", &hunks, "f").unwrap(),
            "a\nb\nc\nD\ne\n"
        );
    }

    #[test]
    fn insertion_into_empty_range_and_wrong_counts() {
        let hunks = parse_patch("@@ -0,0 +1,2 @@\n+x\n+y\n").unwrap();
        assert_eq!(apply_patch("", &hunks, "f").unwrap(), "x\ny\n");
        let err = parse_patch("@@ -1,3 +1,3 @@\n a\n-b\n+B\n").unwrap_err();
        assert!(
            err.to_string().contains("announces 3 old and 3 new"),
            "{err}"
        );
    }

    #[test]
    fn mismatch_names_hunk_and_line() {
        let hunks =
            parse_patch("@@ -1,2 +1,2 @@\n a\n-b\n+B\n@@ -4,1 +4,1 @@\n-zzz\n+q\n").unwrap();
        let err = apply_patch("a\nb\nc\nd\n", &hunks, "f").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("hunk 2 (@@ -4,1 +4,1 @@)"), "{msg}");
        assert!(
            msg.contains("line 4 is `d` but the hunk expects `zzz`"),
            "{msg}"
        );
    }
}
