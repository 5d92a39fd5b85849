//! `grep`: regex search over a tree with ripgrep's own crates.
//!
//! The tree is walked with `ignore` (honouring `.gitignore`, `.ignore` and
//! hidden files the way `rg` does, even outside a git repository), but every
//! file is opened for searching through the sandbox (`openat2` beneath the
//! root), so a directory swapped for a symlink during the walk can at worst
//! make a listing fail, never make a file outside the root readable.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use ignore::overrides::OverrideBuilder;
use ignore::{WalkBuilder, WalkState};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::error::ToolError;
use crate::sandbox::{open_beneath, Open};
use crate::tool::{Args, Tool, ToolContext, ToolSpec};

/// `grep {pattern, path?, glob?, ignore_case?}`. Returns
/// `{matches: ["path:line:text", ...], truncated}`, sorted by path and line;
/// no match is an empty list, not an error.
#[derive(Debug, Default, Clone, Copy)]
pub struct GrepTool;

#[async_trait::async_trait]
impl Tool for GrepTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "grep".into(),
            side_effect: false,
            idempotent: true,
            description: "Search files inside the sandbox for a regular expression (ripgrep syntax), honouring .gitignore.".into(),
            args_schema: json!({
                "type": "object",
                "required": ["pattern"],
                "additionalProperties": false,
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string", "description": "file or folder to search (default: the root)"},
                    "glob": {"type": "string", "description": "only files matching this glob, e.g. *.rs"},
                    "ignore_case": {"type": "boolean"}
                }
            }),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<Value, ToolError> {
        let a = Args::new("grep", &args, &["pattern", "path", "glob", "ignore_case"])?;
        let query = GrepQuery {
            pattern: a.str("pattern")?.to_string(),
            path: a.opt_str("path")?.unwrap_or(".").to_string(),
            glob: a.opt_str("glob")?.map(str::to_string),
            ignore_case: a.opt_bool("ignore_case")?.unwrap_or(false),
        };
        let sandbox = ctx.sandbox;
        let rel = sandbox.relative(&query.path)?;
        // Refuses a start point outside the root before anything is walked.
        sandbox.open_rel(&rel, Open::Any, &query.path)?;
        let root_fd = sandbox
            .root_fd()
            .map_err(|e| ToolError::io("duplicating the sandbox root", e))?;
        let root = sandbox.root().to_path_buf();
        let limit = sandbox.limits().max_output_bytes;
        let cancel = ctx.cancel.clone();
        let hidden = sandbox.hidden().to_vec();
        let result = tokio::task::spawn_blocking(move || {
            search(&query, &root, root_fd, &rel, &hidden, limit, &cancel)
        })
        .await
        .map_err(|e| ToolError::Other(format!("grep task failed: {e}")))??;
        if ctx.cancel.is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        Ok(json!({"matches": result.0, "truncated": result.1}))
    }
}

/// The arguments of one search.
#[derive(Debug, Clone)]
pub struct GrepQuery {
    /// Regular expression (Rust regex syntax, as in `rg`).
    pub pattern: String,
    /// File or folder to search, relative to the root or absolute inside it.
    pub path: String,
    /// Optional whitelist glob.
    pub glob: Option<String>,
    /// Case-insensitive matching.
    pub ignore_case: bool,
}

/// Searches beneath `root` and returns sorted `path:line:text` lines, cut
/// to `limit` bytes in total, and whether the cut happened.
fn search(
    q: &GrepQuery,
    root: &Path,
    root_fd: OwnedFd,
    rel: &Path,
    hidden: &[PathBuf],
    limit: usize,
    cancel: &CancellationToken,
) -> Result<(Vec<String>, bool), ToolError> {
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(q.ignore_case)
        .line_terminator(Some(b'\n'))
        .build(&q.pattern)
        .map_err(|e| ToolError::Pattern {
            pattern: q.pattern.clone(),
            message: e.to_string(),
        })?;
    let walker = walker(q, &root.join(rel), hidden)?;

    // Keep at most a few times the limit before sorting; past that the
    // result is marked truncated anyway.
    let keep_cap = limit.saturating_mul(4).max(4096);
    let found: Mutex<Vec<(String, u64, String)>> = Mutex::new(Vec::new());
    let kept = AtomicUsize::new(0);
    let overflow = AtomicBool::new(false);
    let root_dir = root_fd.as_fd();

    walker.build_parallel().run(|| {
        let mut searcher = SearcherBuilder::new()
            .binary_detection(BinaryDetection::quit(0))
            .line_number(true)
            .build();
        let matcher = matcher.clone();
        let (found, kept, overflow) = (&found, &kept, &overflow);
        Box::new(move |entry| {
            if cancel.is_cancelled() || overflow.load(Ordering::Relaxed) {
                return WalkState::Quit;
            }
            let Ok(entry) = entry else {
                return WalkState::Continue;
            };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                return WalkState::Continue;
            }
            let Ok(file_rel) = entry.path().strip_prefix(root) else {
                return WalkState::Continue;
            };
            let file_rel: PathBuf = file_rel.to_path_buf();
            let Ok(fd) = open_beneath(root_dir, &file_rel, Open::ReadFile) else {
                return WalkState::Continue;
            };
            let file = File::from(fd);
            if !file.metadata().is_ok_and(|m| m.is_file()) {
                return WalkState::Continue;
            }
            let shown = file_rel.to_string_lossy().into_owned();
            let mut local: Vec<(String, u64, String)> = Vec::new();
            let _ = searcher.search_file(
                &matcher,
                &file,
                Lossy(|line_no, line| {
                    let text = line.trim_end_matches(['\n', '\r']).to_string();
                    let size = shown.len() + text.len() + 24;
                    if kept.fetch_add(size, Ordering::Relaxed) + size > keep_cap {
                        overflow.store(true, Ordering::Relaxed);
                        return Ok(false);
                    }
                    local.push((shown.clone(), line_no, text));
                    Ok(true)
                }),
            );
            if !local.is_empty() {
                found
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(local);
            }
            WalkState::Continue
        })
    });
    drop(root_fd);

    let found = found.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(within(found, limit, overflow.load(Ordering::Relaxed)))
}

/// The walk beneath `start`: no links followed, the hidden paths (the
/// store's folder) left out, and the call's `glob` applied.
fn walker(q: &GrepQuery, start: &Path, hidden: &[PathBuf]) -> Result<WalkBuilder, ToolError> {
    let mut walker = WalkBuilder::new(start);
    walker.require_git(false).follow_links(false);
    // The store's folder is out of the tools' reach even inside the root
    // (its logs are text a search would otherwise return); symlinks are
    // not followed, so a path under it is the only way in.
    let hidden: Vec<PathBuf> = hidden.to_vec();
    walker.filter_entry(move |e| !hidden.iter().any(|h| e.path().starts_with(h)));
    if let Some(glob) = &q.glob {
        let mut ob = OverrideBuilder::new(start);
        ob.add(glob)
            .map_err(|e| ToolError::bad_args("grep", "glob", e.to_string()))?;
        walker.overrides(
            ob.build()
                .map_err(|e| ToolError::bad_args("grep", "glob", e.to_string()))?,
        );
    }
    Ok(walker)
}

/// The matches sorted by path and line as `path:line:text`, cut to `limit`
/// bytes in total, and whether anything was left out (`overflow`: the
/// search stopped keeping matches).
fn within(
    mut found: Vec<(String, u64, String)>,
    limit: usize,
    overflow: bool,
) -> (Vec<String>, bool) {
    found.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let mut out = Vec::with_capacity(found.len());
    let mut total = 0usize;
    let mut truncated = overflow;
    for (path, line, text) in found {
        let entry = format!("{path}:{line}:{text}");
        if total + entry.len() + 1 > limit {
            truncated = true;
            break;
        }
        total += entry.len() + 1;
        out.push(entry);
    }
    (out, truncated)
}

/// Runs a search outside any tool call (used by the benchmark): same code
/// path as the `grep` tool.
pub fn grep_blocking(
    sandbox: &crate::sandbox::Sandbox,
    query: &GrepQuery,
) -> Result<(Vec<String>, bool), ToolError> {
    let rel = sandbox.relative(&query.path)?;
    sandbox.open_rel(&rel, Open::Any, &query.path)?;
    let root_fd = sandbox
        .root_fd()
        .map_err(|e| ToolError::io("duplicating the sandbox root", e))?;
    search(
        query,
        sandbox.root(),
        root_fd,
        &rel,
        sandbox.hidden(),
        sandbox.limits().max_output_bytes,
        &CancellationToken::new(),
    )
}
