//! Profiles: named sets of where runs are (a store, or a server and where
//! its token comes from), in the user's `~/.config/cairn/config.toml` and a
//! project's `.cairn.toml` (the nearest at or above the current folder),
//! so that `cairn --profile prod runs` needs no URL or token on the line.
//!
//! ```toml
//! profile = "prod"                 # used when none is named
//! [profiles.prod]
//! server = "https://cairn.internal:8080"
//! token_env = "CAIRN_PROD_TOKEN"   # the token's variable; never the token itself
//! [profiles.local]
//! store = ".cairn/cairn.db"        # relative to the file's folder
//! ```
//!
//! What the command line or the environment says wins over a profile
//! (`--store`, `--server`, `--token`, `CAIRN_*`); a project's profile wins
//! over the user's of the same name, key by key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::bad_input;
use crate::cli::Global;

/// One config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// The profile used when none is named.
    profile: Option<String>,
    #[serde(default)]
    profiles: BTreeMap<String, Profile>,
}

/// One profile.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Profile {
    store: Option<String>,
    server: Option<String>,
    token_env: Option<String>,
}

/// A file read, with its folder (a profile's relative `store` is beside
/// the file that names it).
struct Loaded {
    path: PathBuf,
    file: File,
}

fn read(path: &Path) -> anyhow::Result<Option<Loaded>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad_input(format!("{}: {e}", path.display()))),
    };
    let file: File =
        toml::from_str(&text).map_err(|e| bad_input(format!("{}: {e}", path.display())))?;
    Ok(Some(Loaded {
        path: path.to_path_buf(),
        file,
    }))
}

/// The user's config file.
fn user_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("cairn/config.toml"))
}

/// The nearest `.cairn.toml` at or above `dir`.
fn project_file(dir: &Path) -> Option<PathBuf> {
    crate::cli::searched(dir)
        .map(|d| d.join(".cairn.toml"))
        .find(|p| p.is_file())
}

/// Applies the profile in force to `g`: the one `--profile`/`CAIRN_PROFILE`
/// names, else a file's `profile`, else none. `store_given` says whether
/// the command line or the environment named the store.
pub fn apply(g: &mut Global, store_given: bool) -> anyhow::Result<()> {
    let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let mut files = Vec::new();
    if let Some(p) = user_file() {
        files.extend(read(&p)?);
    }
    if let Some(p) = project_file(&here) {
        files.extend(read(&p)?);
    }
    let name = g
        .profile
        .clone()
        .or_else(|| files.iter().rev().find_map(|f| f.file.profile.clone()));
    let Some(name) = name else {
        return Ok(());
    };
    // User first, then project: the project's keys win.
    let mut merged = Profile::default();
    let mut found = false;
    for f in &files {
        let Some(p) = f.file.profiles.get(&name) else {
            continue;
        };
        found = true;
        let dir = f.path.parent().unwrap_or(Path::new("."));
        if let Some(s) = &p.store {
            merged.store = Some(beside(dir, s));
        }
        if p.server.is_some() {
            merged.server = p.server.clone();
        }
        if p.token_env.is_some() {
            merged.token_env = p.token_env.clone();
        }
    }
    if !found {
        let names: Vec<&str> = files
            .iter()
            .flat_map(|f| f.file.profiles.keys().map(String::as_str))
            .collect();
        let looked: Vec<String> = files.iter().map(|f| f.path.display().to_string()).collect();
        return Err(bad_input(format!(
            "no profile `{name}` in {}{}",
            if looked.is_empty() {
                "any config file (none found)".to_string()
            } else {
                looked.join(", ")
            },
            if names.is_empty() {
                String::new()
            } else {
                format!("; profiles: {}", names.join(", "))
            }
        )));
    }
    if !store_given && g.server.is_none() {
        if let Some(s) = &merged.store {
            g.store = cairn_store::StoreUrl::parse(s)
                .map_err(|e| bad_input(format!("profile `{name}`: {e}")))?;
        }
    }
    if g.server.is_none() && !store_given {
        g.server = merged.server.clone();
    }
    if g.token.is_none() {
        if let Some(var) = &merged.token_env {
            match std::env::var(var) {
                Ok(t) if !t.is_empty() => g.token = Some(t),
                _ => {
                    return Err(bad_input(format!(
                        "profile `{name}` takes its token from {var}, which is not set"
                    )))
                }
            }
        }
    }
    Ok(())
}

/// A store address of a file in `dir`: a relative path is beside the file.
fn beside(dir: &Path, store: &str) -> String {
    if store.contains("://") || Path::new(store).is_absolute() {
        return store.to_string();
    }
    dir.join(store).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_and_refuses_unknown_keys() {
        let f: File = toml::from_str(
            "profile = \"a\"\n[profiles.a]\nserver = \"http://x\"\ntoken_env = \"T\"\n",
        )
        .unwrap();
        assert_eq!(f.profile.as_deref(), Some("a"));
        assert_eq!(f.profiles["a"].server.as_deref(), Some("http://x"));
        assert!(toml::from_str::<File>("[profiles.a]\ntoken = \"secret\"\n").is_err());
    }

    #[test]
    fn a_relative_store_is_beside_its_file() {
        assert_eq!(
            beside(Path::new("/p"), ".cairn/cairn.db"),
            "/p/.cairn/cairn.db"
        );
        assert_eq!(beside(Path::new("/p"), "/abs.db"), "/abs.db");
        assert_eq!(
            beside(Path::new("/p"), "postgres://h/db"),
            "postgres://h/db"
        );
    }
}
