//! The workflows `POST /v1/runs` may start: files named inside the server's
//! workflows folder (`--workflows`), never paths.
//!
//! A name is looked up only inside the folder, and the file actually opened
//! must still be inside it once symlinks are resolved; its size is checked
//! from the open file's metadata before anything is read, and the read
//! itself stops one byte past the limit, so a file that grows meanwhile is
//! refused too. Errors name the request's parameter, never the folder's path,
//! and never echo what the file holds: a file that fails to parse is reported
//! by line, column and field only (the full problems go to the server's
//! stderr, for its operator).

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use cairn_api::ProblemLocation;
use cairn_workflow::{Workflow, WorkflowError};
use serde_json::Value;

use crate::error::ApiError;

/// Extensions tried, in this order, for a name given without one.
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// Longest workflow name accepted, in bytes.
const MAX_NAME: usize = 255;

/// Loads the workflow `name` from `dir`, refusing anything that is not a
/// file inside it or that is larger than `max_bytes`.
pub(crate) fn load(dir: Option<&Path>, name: &str, max_bytes: u64) -> Result<Workflow, ApiError> {
    let Some(dir) = dir else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "workflows_disabled",
            "request body: `workflow`: this server starts no workflows: it was started without a workflows folder (`cairn serve --workflows DIR`)",
        ));
    };
    check_name(name)?;
    let (path, file) = open_beneath(dir, name)?;
    let source = read_bounded(file, name, max_bytes)?;
    cairn_workflow::parse(&source, &path).map_err(|e| invalid(name, &path, dir, &e))
}

/// A name is one or more `/`-separated segments of letters, digits, `_`,
/// `-` and `.`, none starting with `.`: no absolute paths, no `..`, no
/// hidden files, no empty segments.
fn check_name(name: &str) -> Result<(), ApiError> {
    let segment_ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    };
    if name.len() <= MAX_NAME && name.split('/').all(segment_ok) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_workflow_name",
        format!(
            "request body: `workflow`: {} is not a workflow name: name a workflow file inside the server's workflows folder (letters, digits, `_`, `-` and `.`, not first; subfolders with `/`; up to {MAX_NAME} bytes), not a path",
            shown(name)
        ),
    ))
}

/// The client's own text, quoted and cut short so an error stays readable.
fn shown(name: &str) -> String {
    let cut: String = name.chars().take(64).collect();
    let more = if cut.len() < name.len() { "…" } else { "" };
    format!("`{}{more}`", cut.escape_debug())
}

/// The names tried for `name`: itself when it has a workflow extension,
/// else `name.yaml`, `name.yml`, `name.json`.
fn candidates(name: &str) -> Vec<String> {
    let has_ext = Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.contains(&e));
    if has_ext {
        vec![name.to_string()]
    } else {
        EXTENSIONS.iter().map(|e| format!("{name}.{e}")).collect()
    }
}

/// Opens the first candidate that exists and proves the open file lies
/// inside `dir`: the canonical path of what was named must be under the
/// canonical folder, and must be the very file opened (same device and
/// inode), so a symlink swapped between the two steps is caught too.
fn open_beneath(dir: &Path, name: &str) -> Result<(PathBuf, File), ApiError> {
    let root = dir.canonicalize().map_err(|e| {
        ApiError::internal(format!(
            "the server's workflows folder cannot be opened: {}",
            e.kind()
        ))
    })?;
    let tried = candidates(name);
    for rel in &tried {
        let path = dir.join(rel);
        // Non-blocking, so that opening a FIFO someone left there does not
        // hang the request; it is refused below as not a regular file.
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                continue
            }
            Err(e) => return Err(unreadable(rel, &e)),
        };
        let meta = file.metadata().map_err(|e| unreadable(rel, &e))?;
        let real = path.canonicalize().map_err(|e| unreadable(rel, &e))?;
        let same =
            std::fs::metadata(&real).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
        if !real.starts_with(&root) || !same {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "workflow_outside_folder",
                format!(
                    "request body: `workflow`: `{rel}` leads outside the server's workflows folder (a symlink?); only files inside it can be started"
                ),
            ));
        }
        if !meta.is_file() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_workflow_name",
                format!("request body: `workflow`: `{rel}` is not a file"),
            ));
        }
        return Ok((path, file));
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "workflow_not_found",
        format!(
            "request body: `workflow`: no workflow {} in the server's workflows folder (looked for {})",
            shown(name),
            tried.join(", ")
        ),
    ))
}

/// A workflow file the server cannot read: refused (403), unless the
/// server itself is out of file descriptors, which is not the file's fault
/// and passes (503, retried).
fn unreadable(rel: &str, e: &std::io::Error) -> ApiError {
    if crate::error::io_out_of_descriptors(e) {
        return ApiError::out_of_descriptors(e);
    }
    ApiError::new(
        StatusCode::FORBIDDEN,
        "workflow_unreadable",
        format!(
            "request body: `workflow`: `{rel}` cannot be read by the server ({})",
            e.kind()
        ),
    )
}

/// Reads at most `max_bytes`: the size is checked from the open file first,
/// and the read stops one byte past the limit in case the file grew.
fn read_bounded(file: File, name: &str, max_bytes: u64) -> Result<String, ApiError> {
    let too_large = |size: Option<u64>| {
        let size = size.map(|s| format!(" ({s} bytes)")).unwrap_or_default();
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "workflow_too_large",
            format!(
                "request body: `workflow`: {}{size} is larger than this server reads ({max_bytes} bytes; `cairn serve --max-workflow-bytes`)",
                shown(name)
            ),
        )
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size > max_bytes {
        return Err(too_large(Some(size)));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(name, &e))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(None));
    }
    String::from_utf8(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_workflow",
            format!(
                "request body: `workflow`: {} is not UTF-8 text (first bad byte at offset {})",
                shown(name),
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// A 400 that locates each problem without quoting the file: what the
/// problems say can include the file's own text.
fn invalid(name: &str, path: &Path, dir: &Path, e: &WorkflowError) -> ApiError {
    eprintln!("cairn serve: POST /v1/runs: workflow `{name}` is invalid:\n{e}");
    let rel = path.strip_prefix(dir).unwrap_or(path);
    let mut err = ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_workflow",
        format!(
            "request body: `workflow`: {} is not a valid workflow ({} problem{}; the server's log says what they are, or run `cairn validate` on the file)",
            shown(name),
            e.problems.len(),
            if e.problems.len() == 1 { "" } else { "s" }
        ),
    );
    err.details = Some(problem_locations(e, &rel.display().to_string()));
    err
}

/// Each problem's place (file, line, column, field), with `file` as given
/// and the field cut to its [`known_field`] part.
pub(crate) fn problem_locations(e: &WorkflowError, file: &str) -> Value {
    let places: Vec<ProblemLocation> = e
        .problems
        .iter()
        .map(|p| ProblemLocation {
            file: file.to_string(),
            line: p.line,
            column: p.column,
            field: p.field.as_deref().and_then(known_field),
        })
        .collect();
    serde_json::to_value(places).expect("places serialize to JSON")
}

/// The leading part of a field path made only of the format's own field
/// names ([`cairn_workflow::field_names`]) (each optionally indexed, `nodes[2]`); `None` when not even the
/// first key is one. What follows the first other key is left out: the
/// line and column still say where it is.
fn known_field(field: &str) -> Option<String> {
    // A field path names the keys it passes through; a key the format does
    // not know (an unknown field, a key of `env` or `args`, every "key" of
    // a file that is not a workflow at all, such as `root:$6$...:` of a
    // password file) is the file's own text.
    let fields = cairn_workflow::field_names();
    let known = |seg: &str| {
        let name = seg.split('[').next().unwrap_or("");
        let indices = &seg[name.len()..];
        fields.contains(name)
            && indices.split_terminator(']').all(|i| {
                i.strip_prefix('[')
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
    };
    let kept: Vec<&str> = field.split('.').take_while(|s| known(s)).collect();
    (!kept.is_empty()).then(|| kept.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_out_of_descriptors_does_not_blame_the_file() {
        let e = unreadable("w.yaml", &std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!((e.status.as_u16(), e.code), (503, "out_of_descriptors"));
        let e = unreadable("w.yaml", &std::io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!((e.status.as_u16(), e.code), (403, "workflow_unreadable"));
    }

    #[test]
    fn names_are_relative_and_plain() {
        for ok in ["review", "review.yaml", "team/review", "a_b-c.v2", "x.json"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/shadow",
            "../x",
            "a/../../x",
            "a//b",
            ".hidden",
            "a/.b",
            "a/",
            "a\\b",
            "a b",
            "x\0y",
            "é",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&"a".repeat(MAX_NAME + 1)).is_err());
    }

    #[test]
    fn fields_keep_only_the_formats_own_names() {
        assert_eq!(
            known_field("nodes[2].retry.attempts").as_deref(),
            Some("nodes[2].retry.attempts")
        );
        assert_eq!(known_field("nodes[0].valeu").as_deref(), Some("nodes[0]"));
        assert_eq!(
            known_field("nodes[0].env.AWS_SECRET").as_deref(),
            Some("nodes[0].env")
        );
        assert_eq!(known_field("root:$6$hash:19000:0:99999:7::"), None);
        assert_eq!(known_field("password"), None);
        assert_eq!(known_field("nodes[x]"), None);
        assert_eq!(
            known_field("nodes[1][2].id").as_deref(),
            Some("nodes[1][2].id")
        );
        assert_eq!(known_field(""), None);
    }

    #[test]
    fn names_without_an_extension_try_each() {
        assert_eq!(candidates("a"), ["a.yaml", "a.yml", "a.json"]);
        assert_eq!(candidates("a.yml"), ["a.yml"]);
        assert_eq!(candidates("a.v2"), ["a.v2.yaml", "a.v2.yml", "a.v2.json"]);
    }
}
