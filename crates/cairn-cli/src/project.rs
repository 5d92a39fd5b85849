//! Getting started and fitting in: `cairn init`, shell completions and the
//! man page, the last two generated from the one CLI definition (clap), so
//! they cannot drift from the flags.

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;

use crate::bad_input;
use crate::cli::{Cli, CompletionsArgs, InitArgs};

/// The starter workflow: a command, a value built from its output, a
/// failure handler, and where to read on.
const STARTER: &str = r#"# A first workflow: `cairn run workflow.yaml`, then `cairn status <run>`.
# The format: docs/workflows.md in Cairn's repository.
name: starter
description: List the files here, count them, and say so.
input:
  type: object
  properties:
    greeting: { type: string }
nodes:
  - id: list
    command: ["ls", "-1"]
    output: lines
  - id: count
    needs: [list]
    value: { files: "{{ nodes.list.output | length }}" }
  - id: say
    needs: [count]
    command: ["echo", "{{ input.greeting | default('hello') }}: {{ nodes.count.output.files }} files"]
  - id: on_failure
    needs: [say]
    if: "failure()"
    value: "something failed: {{ nodes.say.error.message if nodes.say.error else 'before say' }}"
"#;

/// The line `cairn init` adds to `.gitignore`.
const IGNORE: &str = ".cairn/";

/// `cairn init`: writes the starter workflow (never over a file) and adds
/// `.cairn/` to `.gitignore` (once).
pub fn init(a: InitArgs) -> anyhow::Result<u8> {
    if a.file.exists() {
        return Err(bad_input(format!(
            "{} exists; `cairn init <file>` writes the starter elsewhere",
            a.file.display()
        )));
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&a.file)
        .map_err(|e| bad_input(format!("{}: {e}", a.file.display())))?;
    f.write_all(STARTER.as_bytes())?;
    println!("wrote {}", a.file.display());
    let dir = a
        .file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let gitignore = dir.join(".gitignore");
    if ignore(&gitignore)? {
        println!(
            "added {IGNORE} to {}",
            gitignore.strip_prefix(".").unwrap_or(&gitignore).display()
        );
    }
    println!("next: cairn run {}", a.file.display());
    Ok(crate::EXIT_OK)
}

/// Adds `.cairn/` to a `.gitignore` that does not ignore it yet; true when
/// it did.
fn ignore(path: &Path) -> anyhow::Result<bool> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e.into()),
    };
    let listed = text
        .lines()
        .map(str::trim)
        .any(|l| matches!(l, ".cairn" | ".cairn/" | "/.cairn" | "/.cairn/"));
    if listed {
        return Ok(false);
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    if !text.is_empty() && !text.ends_with('\n') {
        f.write_all(b"\n")?;
    }
    writeln!(f, "{IGNORE}")?;
    Ok(true)
}

/// `cairn completions <shell>`.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<u8> {
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "cairn", &mut std::io::stdout());
    Ok(crate::EXIT_OK)
}

/// `cairn man`: the man page, roff on stdout.
pub fn man() -> anyhow::Result<u8> {
    let cmd = Cli::command();
    match clap_mangen::Man::new(cmd).render(&mut std::io::stdout()) {
        // `cairn man | head` closed the pipe: what was wanted was read.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(crate::EXIT_OK),
        r => r.map(|()| crate::EXIT_OK).map_err(Into::into),
    }
}
