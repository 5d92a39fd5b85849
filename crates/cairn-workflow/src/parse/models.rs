//! `models:`: the models agents and scorers may name.

use std::collections::BTreeMap;

use super::{is_node_id, join, Cx, Fields};
use crate::yaml::{Node, Yaml};
use cairn_models::{Limits, ModelConfig, Price, ProviderKind, WireFormat, PROVIDERS};

pub(super) const MODEL_FIELDS: &[&str] = &[
    "provider",
    "model",
    "api_key_env",
    "api_key_secret",
    "base_url",
    "max_tokens",
    "temperature",
    "idle_timeout",
    "timeout",
    "retry",
    "price",
    "script",
    "prompt_cache",
    "context_window",
    "max_concurrency",
    "requests_per_minute",
    "tokens_per_minute",
    "fallback",
];
pub(super) const PRICE_FIELDS: &[&str] = &["input", "output", "cache_read", "cache_write"];

impl Cx {
    /// `models:`: each entry a model agents may name.
    pub(super) fn models(&mut self, node: &Node) -> BTreeMap<String, ModelConfig> {
        let mut out = BTreeMap::new();
        let Yaml::Map(entries) = &node.value else {
            self.at(
                node.pos,
                Some("models"),
                format!(
                    "expected a mapping of named models, found {}",
                    node.value.type_name()
                ),
            );
            return out;
        };
        for (k, v) in entries {
            let name = k.key_text();
            let mf = join("models", &name);
            if !is_node_id(&name) {
                self.at(
                    k.pos,
                    Some(&mf),
                    format!("`{name}` is not a valid model name; use letters, digits, `_` and `-`"),
                );
                continue;
            }
            if out.contains_key(&name) {
                self.at(k.pos, Some(&mf), format!("duplicate model `{name}`"));
                continue;
            }
            if let Some(def) = self.model(v, &mf, &name) {
                out.insert(name, def);
            }
        }
        self.check_fallbacks(entries, &out);
        out
    }

    /// Each `fallback` names another model of the file.
    fn check_fallbacks(
        &mut self,
        entries: &[(Node, Node)],
        models: &BTreeMap<String, ModelConfig>,
    ) {
        for (k, v) in entries {
            let name = k.key_text();
            let Some(def) = models.get(&name) else {
                continue;
            };
            let Yaml::Map(fields) = &v.value else {
                continue;
            };
            let Some((_, list)) = fields.iter().find(|(fk, _)| fk.key_text() == "fallback") else {
                continue;
            };
            let items: Vec<&Node> = match &list.value {
                Yaml::Seq(items) => items.iter().collect(),
                _ => vec![list],
            };
            for (i, other) in def.fallback.iter().enumerate() {
                let pos = items.get(i).map_or(list.pos, |n| n.pos);
                let field = format!("{}[{i}]", join(&join("models", &name), "fallback"));
                if *other == name {
                    self.at(
                        pos,
                        Some(&field),
                        format!("model `{name}` cannot be its own fallback"),
                    );
                } else if !models.contains_key(other) {
                    let hint = unknown_model_hint(models);
                    self.at(
                        pos,
                        Some(&field),
                        format!("no model named `{other}`; {hint}"),
                    );
                }
            }
        }
    }

    fn model(&mut self, node: &Node, field: &str, name: &str) -> Option<ModelConfig> {
        let f = self.fields(node, field, MODEL_FIELDS, "in a model")?;
        let provider = self.model_provider(node, field, &f)?;
        // A scripted model's turns come from its file, which names no model.
        let scripted = provider.def().wire == WireFormat::Script;
        let model = match f.get("model") {
            Some((_, m)) => self.string(m, &join(field, "model"))?,
            None if scripted => name.to_string(),
            None => {
                self.at(
                    node.pos,
                    Some(&join(field, "model")),
                    "missing required field `model` (the provider's model id)",
                );
                return None;
            }
        };
        let opt_string = |cx: &mut Cx, key: &str| {
            f.get(key)
                .and_then(|(_, v)| cx.string(v, &join(field, key)))
        };
        let api_key_env = opt_string(self, "api_key_env");
        let api_key_secret = opt_string(self, "api_key_secret");
        let base_url = opt_string(self, "base_url");
        if let (Some(url), Some((_, v))) = (&base_url, f.get("base_url")) {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                self.at(
                    v.pos,
                    Some(&join(field, "base_url")),
                    format!("`{url}` is not an http:// or https:// address"),
                );
            }
        }
        let script = opt_string(self, "script");
        self.script_fits(node, field, &f, script.is_some(), scripted);
        let max_tokens = f
            .get("max_tokens")
            .and_then(|(_, v)| self.uint(v, &join(field, "max_tokens"), 1))
            .map(|n| n.min(u32::MAX as u64) as u32);
        let temperature = f
            .get("temperature")
            .and_then(|(_, v)| self.number(v, &join(field, "temperature")));
        let idle_timeout = f
            .get("idle_timeout")
            .and_then(|(_, v)| self.duration(v, &join(field, "idle_timeout")));
        let timeout = f
            .get("timeout")
            .and_then(|(_, v)| self.duration(v, &join(field, "timeout")));
        let retry = f
            .get("retry")
            .and_then(|(_, v)| self.retry(v, &join(field, "retry")));
        let price = self.model_price(field, &f)?;
        let prompt_cache = f
            .get("prompt_cache")
            .and_then(|(_, v)| self.bool(v, &join(field, "prompt_cache")));
        let count = |cx: &mut Cx, key: &str, min: i64| {
            f.get(key)
                .and_then(|(_, v)| cx.uint(v, &join(field, key), min))
        };
        let context_window = count(self, "context_window", 256);
        let limits = Limits {
            max_concurrency: count(self, "max_concurrency", 1)
                .map(|n| n.min(u32::MAX as u64) as u32),
            requests_per_minute: count(self, "requests_per_minute", 1)
                .map(|n| n.min(u32::MAX as u64) as u32),
            tokens_per_minute: count(self, "tokens_per_minute", 1),
        };
        let fallback = match f.get("fallback") {
            Some((_, v)) => self.model_names(v, &join(field, "fallback"))?,
            None => Vec::new(),
        };
        Some(ModelConfig {
            provider,
            model,
            api_key_env,
            api_key_secret,
            api_key: None,
            base_url,
            max_tokens,
            temperature,
            idle_timeout,
            timeout,
            retry,
            price,
            script,
            prompt_cache,
            context_window,
            limits,
            fallback,
        })
    }

    /// A list of model names (one name alone is a list of one).
    fn model_names(&mut self, node: &Node, field: &str) -> Option<Vec<String>> {
        let items: Vec<&Node> = match &node.value {
            Yaml::Seq(items) => items.iter().collect(),
            Yaml::Str(_) => vec![node],
            other => {
                self.at(
                    node.pos,
                    Some(field),
                    format!(
                        "expected a list of model names, found {}",
                        other.type_name()
                    ),
                );
                return None;
            }
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| self.string(item, &format!("{field}[{i}]")))
            .collect()
    }

    /// The model's `provider`, which is required and must be one Cairn knows.
    fn model_provider(&mut self, node: &Node, field: &str, f: &Fields) -> Option<ProviderKind> {
        match f.get("provider") {
            Some((_, p)) => {
                let pf = join(field, "provider");
                let p_name = self.string(p, &pf)?;
                let Some(provider) = ProviderKind::parse(&p_name) else {
                    self.at_hint(
                        p.pos,
                        Some(&pf),
                        format!("unknown provider `{p_name}`"),
                        Some(format!("use {}", providers(true))),
                    );
                    return None;
                };
                Some(provider)
            }
            None => {
                self.at(
                    node.pos,
                    Some(&join(field, "provider")),
                    format!("missing required field `provider` ({})", providers(false)),
                );
                None
            }
        }
    }

    /// The model's `price` per million tokens, if given (`None` inside
    /// when absent; the outer `None` after a problem was reported).
    fn model_price(&mut self, field: &str, f: &Fields) -> Option<Option<Price>> {
        Some(match f.get("price") {
            Some((_, v)) => {
                let pf = join(field, "price");
                let p = self.fields(v, &pf, PRICE_FIELDS, "in a price")?;
                let get = |cx: &mut Cx, key: &str| {
                    p.get(key)
                        .map(|(_, n)| cx.number(n, &join(&pf, key)))
                        .unwrap_or(Some(0.0))
                };
                Some(Price {
                    input: get(self, "input")?,
                    output: get(self, "output")?,
                    cache_read: get(self, "cache_read")?,
                    cache_write: get(self, "cache_write")?,
                })
            }
            None => None,
        })
    }

    /// Reports a scripted model without `script`, or `script` on another.
    fn script_fits(
        &mut self,
        node: &Node,
        field: &str,
        f: &Fields,
        has_script: bool,
        scripted: bool,
    ) {
        match (has_script, scripted) {
            (false, true) => self.at(
                node.pos,
                Some(&join(field, "script")),
                "a scripted model needs `script` (its file of turns)",
            ),
            (true, false) => {
                let pos = f.get("script").map_or(node.pos, |(k, _)| k.pos);
                self.at(
                    pos,
                    Some(&join(field, "script")),
                    "`script` is only for scripted models",
                );
            }
            _ => {}
        }
    }
}

/// What to tell of a model name `models` does not declare.
pub(crate) fn unknown_model_hint(models: &BTreeMap<String, ModelConfig>) -> String {
    if models.is_empty() {
        "declare it under `models:` at the top level".to_string()
    } else {
        format!(
            "the workflow's models are: {}",
            models.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    }
}

/// The providers' names, `a, b or c`, each with what else speaks its format
/// when `also` (`openai (also for vLLM, ...)`).
fn providers(also: bool) -> String {
    let names: Vec<String> = PROVIDERS
        .iter()
        .map(|p| match p.also_for {
            Some(more) if also => format!("{} (also for {more})", p.name),
            _ => p.name.to_string(),
        })
        .collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}
