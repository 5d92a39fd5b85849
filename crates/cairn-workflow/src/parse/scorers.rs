//! A node's `scorers:` list: each entry a command or an agent that grades
//! the node's output (WORKFLOW.md, "Scorers, snapshots, reload").

use std::collections::{BTreeMap, HashMap};

use super::{is_node_id, join, Cx};
use crate::model::{NodeSpec, ScorerAgent, ScorerKind, ScorerSpec};
use crate::yaml::{Node, Pos, Yaml};
use cairn_models::ModelConfig;

pub(super) const SCORER_FIELDS: &[&str] = &["id", "name", "command", "agent", "block"];
pub(super) const SCORER_AGENT_FIELDS: &[&str] = &["model", "system", "prompt"];

impl Cx {
    /// The `scorers` of a node; entries with problems are left out (the
    /// problems are reported, so the file does not load).
    pub(super) fn scorers(&mut self, node: &Node, field: &str) -> Vec<ScorerSpec> {
        let Yaml::Seq(items) = &node.value else {
            self.at(
                node.pos,
                Some(field),
                format!(
                    "expected a list of scorers, found {}",
                    node.value.type_name()
                ),
            );
            return Vec::new();
        };
        let mut out: Vec<ScorerSpec> = Vec::with_capacity(items.len());
        let mut first: HashMap<String, usize> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let sf = format!("{field}[{i}]");
            let Some(s) = self.scorer(item, &sf) else {
                continue;
            };
            if let Some(line) = first.get(&s.id) {
                self.at_hint(
                    item.pos,
                    Some(&join(&sf, "id")),
                    format!("duplicate scorer id `{}`", s.id),
                    Some(format!("first given on line {line}")),
                );
                continue;
            }
            first.insert(s.id.clone(), item.pos.line);
            out.push(s);
        }
        out
    }

    fn scorer(&mut self, node: &Node, field: &str) -> Option<ScorerSpec> {
        let f = self.fields(node, field, SCORER_FIELDS, "in a scorer")?;
        let before = self.problems.len();
        let id = match f.get("id") {
            Some((_, v)) => {
                let idf = join(field, "id");
                let id = self.string(v, &idf)?;
                if !is_node_id(&id) {
                    self.at_hint(
                        v.pos,
                        Some(&idf),
                        format!("`{id}` is not a valid scorer id"),
                        Some("use letters, digits, `_` and `-`".into()),
                    );
                    return None;
                }
                id
            }
            None => {
                self.at(
                    node.pos,
                    Some(&join(field, "id")),
                    "missing required field `id`",
                );
                return None;
            }
        };
        let name = match f.get("name") {
            Some((_, v)) => self.string(v, &join(field, "name"))?,
            None => id.clone(),
        };
        let block = match f.get("block") {
            Some((_, v)) => self.bool(v, &join(field, "block"))?,
            None => false,
        };
        let kind = match (f.get("command"), f.get("agent")) {
            (Some((_, v)), None) => {
                ScorerKind::Command(self.scorer_argv(v, &join(field, "command"))?)
            }
            (None, Some((_, v))) => ScorerKind::Agent(self.scorer_agent(v, &join(field, "agent"))?),
            (None, None) => {
                self.at_hint(
                    node.pos,
                    Some(field),
                    "a scorer needs `command` or `agent`",
                    Some(
                        "`command` runs a program that prints a score; `agent` asks a model".into(),
                    ),
                );
                return None;
            }
            (Some(_), Some((k, _))) => {
                self.at(
                    k.pos,
                    Some(&join(field, "agent")),
                    "a scorer has either `command` or `agent`, not both",
                );
                return None;
            }
        };
        (self.problems.len() == before).then_some(ScorerSpec {
            id,
            name,
            kind,
            block,
            line: node.pos.line,
        })
    }

    /// A command scorer's argv: a non-empty list of words, each a template.
    fn scorer_argv(&mut self, v: &Node, field: &str) -> Option<Vec<String>> {
        let Yaml::Seq(items) = &v.value else {
            self.at_hint(
                v.pos,
                Some(field),
                format!("expected a list (the argv), found {}", v.value.type_name()),
                Some(
                    "commands run without a shell; write [\"sh\", \"-c\", \"...\"] to use one"
                        .into(),
                ),
            );
            return None;
        };
        if items.is_empty() {
            self.at(v.pos, Some(field), "the argv is empty");
            return None;
        }
        let mut argv = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let af = format!("{field}[{i}]");
            let text = self.text(item, &af)?;
            self.check_template_at(&text, item.pos, &af);
            argv.push(text);
        }
        Some(argv)
    }

    /// An agent scorer: a model (checked against `models` once the whole
    /// file is read), an optional system prompt and the prompt.
    fn scorer_agent(&mut self, v: &Node, field: &str) -> Option<ScorerAgent> {
        let f = self.fields(v, field, SCORER_AGENT_FIELDS, "in a scorer's agent")?;
        let model = match f.get("model") {
            Some((_, m)) => self.string(m, &join(field, "model")),
            None => {
                self.at(
                    v.pos,
                    Some(&join(field, "model")),
                    "missing required field `model` (a name from `models`)",
                );
                None
            }
        };
        let system = match f.get("system") {
            Some((_, s)) => Some(self.template(s, &join(field, "system"))?),
            None => None,
        };
        let prompt = match f.get("prompt") {
            Some((_, p)) => self.template(p, &join(field, "prompt")),
            None => {
                self.at(
                    v.pos,
                    Some(&join(field, "prompt")),
                    "missing required field `prompt` (what the model grades)",
                );
                None
            }
        };
        Some(ScorerAgent {
            model: model?,
            system,
            prompt: prompt?,
        })
    }

    /// Every agent scorer names a model the workflow declares (checked once
    /// the whole file is read: `models` may come after `nodes`).
    pub(super) fn scorer_models(
        &mut self,
        nodes: &[NodeSpec],
        field: &str,
        models: &BTreeMap<String, ModelConfig>,
    ) {
        for (i, n) in nodes.iter().enumerate() {
            let nf = format!("{field}[{i}]");
            for (j, s) in n.scorers.iter().enumerate() {
                let ScorerKind::Agent(a) = &s.kind else {
                    continue;
                };
                if models.contains_key(&a.model) {
                    continue;
                }
                let hint = super::unknown_model_hint(models);
                self.at_hint(
                    Pos {
                        line: s.line,
                        col: 1,
                    },
                    Some(&format!("{nf}.scorers[{j}].agent.model")),
                    format!(
                        "scorer `{}` of node `{}` names model `{}`, which `models` does not declare",
                        s.id, n.id, a.model
                    ),
                    Some(hint),
                );
            }
            if let Some((body, nodes)) = n.kind.body() {
                self.scorer_models(nodes, &format!("{nf}.{body}"), models);
            }
        }
    }
}
