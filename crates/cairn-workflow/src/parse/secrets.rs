//! `env:` and `secrets:` at the top of a workflow, and the secrets nodes and
//! models name (WORKFLOW.md, "Secrets and environment").

use std::collections::BTreeMap;

use super::{closest, join, Cx};
use crate::model::{NodeSpec, SecretSource};
use crate::yaml::{Node, Pos, Yaml};
use crate::ModelConfig;

/// The keys of one secret's source: exactly one of them.
pub(crate) const SECRET_FIELDS: &[&str] = &["env", "file", "command"];

/// Whether `name` can be an environment variable's name.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Cx {
    fn env_name(&mut self, key: &Node, field: &str) -> Option<String> {
        let name = key.key_text();
        if is_env_name(&name) {
            return Some(name);
        }
        self.at_hint(
            key.pos,
            Some(field),
            format!("`{name}` is not an environment variable's name"),
            Some("use letters, digits and `_`, not starting with a digit".into()),
        );
        None
    }

    /// The workflow's `env:`: plain values, no templates.
    pub(crate) fn workflow_env(&mut self, node: &Node) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let Yaml::Map(entries) = &node.value else {
            self.at(
                node.pos,
                Some("env"),
                format!(
                    "expected a mapping of variables, found {}",
                    node.value.type_name()
                ),
            );
            return out;
        };
        for (k, v) in entries {
            let f = join("env", &k.key_text());
            let Some(name) = self.env_name(k, &f) else {
                continue;
            };
            let Some(text) = self.text(v, &f) else {
                continue;
            };
            if crate::has_markup(&text) {
                self.at_hint(
                    v.pos,
                    Some(&f),
                    "the workflow's `env` holds plain values, not templates",
                    Some("put a templated variable in a node's `env`".into()),
                );
                continue;
            }
            out.insert(name, text);
        }
        out
    }

    /// The workflow's `secrets:`: each name with exactly one source.
    pub(crate) fn secrets(&mut self, node: &Node) -> BTreeMap<String, SecretSource> {
        let mut out = BTreeMap::new();
        let Yaml::Map(entries) = &node.value else {
            self.at(
                node.pos,
                Some("secrets"),
                format!(
                    "expected a mapping of secret names to their sources, found {}",
                    node.value.type_name()
                ),
            );
            return out;
        };
        for (k, v) in entries {
            let f = join("secrets", &k.key_text());
            let Some(name) = self.env_name(k, &f) else {
                continue;
            };
            let Some(fields) = self.fields(v, &f, SECRET_FIELDS, "in a secret") else {
                continue;
            };
            if fields.len() != 1 {
                self.at_hint(
                    v.pos,
                    Some(&f),
                    format!("secret `{name}` needs exactly one source"),
                    Some("one of `env: VAR`, `file: path`, `command: [argv]`".into()),
                );
                continue;
            }
            let (key, (_, sv)) = fields.iter().next().expect("one field");
            let sf = join(&f, key);
            let source = match key.as_str() {
                "env" => self.string(sv, &sf).map(SecretSource::Env),
                "file" => self.string(sv, &sf).map(SecretSource::File),
                _ => self.secret_command(sv, &sf).map(SecretSource::Command),
            };
            match source {
                Some(SecretSource::Env(e)) if !is_env_name(&e) => {
                    self.at(
                        sv.pos,
                        Some(&sf),
                        format!("`{e}` is not an environment variable's name"),
                    );
                }
                Some(SecretSource::File(p)) if p.trim().is_empty() => {
                    self.at(sv.pos, Some(&sf), "the file's path is empty");
                }
                Some(s) => {
                    out.insert(name, s);
                }
                None => {}
            }
        }
        out
    }

    fn secret_command(&mut self, node: &Node, field: &str) -> Option<Vec<String>> {
        let Yaml::Seq(items) = &node.value else {
            self.at_hint(
                node.pos,
                Some(field),
                format!("expected an argv list, found {}", node.value.type_name()),
                Some("the command runs without a shell: `[pass, show, npm]`".into()),
            );
            return None;
        };
        let argv: Vec<String> = items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| self.text(item, &format!("{field}[{i}]")))
            .collect();
        if argv.len() != items.len() {
            return None;
        }
        if argv.is_empty() || argv[0].is_empty() {
            self.at(node.pos, Some(field), "the command is empty");
            return None;
        }
        Some(argv)
    }

    /// A node's `secrets: [NAME]`.
    pub(crate) fn node_secrets(&mut self, node: &Node, field: &str) -> Vec<String> {
        let Yaml::Seq(items) = &node.value else {
            self.at(
                node.pos,
                Some(field),
                format!(
                    "expected a list of secret names, found {}",
                    node.value.type_name()
                ),
            );
            return Vec::new();
        };
        items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| self.string(item, &format!("{field}[{i}]")))
            .collect()
    }

    /// Every secret a node or a model names is declared (checked once the
    /// whole file is read, as `secrets:` may come after `nodes:`).
    pub(crate) fn check_secret_uses(
        &mut self,
        nodes: &[NodeSpec],
        field: &str,
        secrets: &BTreeMap<String, SecretSource>,
    ) {
        for (i, n) in nodes.iter().enumerate() {
            let nf = format!("{field}[{i}]");
            for (j, name) in n.secrets.iter().enumerate() {
                if !secrets.contains_key(name) {
                    self.undeclared(
                        Pos {
                            line: n.line,
                            col: 1,
                        },
                        &format!("{nf}.secrets[{j}]"),
                        name,
                        secrets,
                    );
                }
            }
            if let Some((body, children)) = n.kind.body() {
                self.check_secret_uses(children, &format!("{nf}.{body}"), secrets);
            }
        }
    }

    /// Every model's `api_key_secret` is declared.
    pub(crate) fn check_model_secrets(
        &mut self,
        models: &BTreeMap<String, ModelConfig>,
        secrets: &BTreeMap<String, SecretSource>,
        pos: Pos,
    ) {
        for (name, m) in models {
            if let Some(s) = &m.api_key_secret {
                if !secrets.contains_key(s) {
                    self.undeclared(pos, &format!("models.{name}.api_key_secret"), s, secrets);
                }
            }
        }
    }

    fn undeclared(
        &mut self,
        pos: Pos,
        field: &str,
        name: &str,
        secrets: &BTreeMap<String, SecretSource>,
    ) {
        let hint = match closest(name, secrets.keys().map(String::as_str)) {
            Some(c) => format!("did you mean `{c}`?"),
            None => format!("declare it under `secrets:` (`{name}: {{ env: {name} }}`)"),
        };
        self.at_hint(
            pos,
            Some(field),
            format!("secret `{name}` is not declared in `secrets`"),
            Some(hint),
        );
    }
}
