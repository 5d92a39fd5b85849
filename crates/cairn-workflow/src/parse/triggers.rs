//! Reading a triggers file (`cairn serve --triggers`) and one schedule as
//! the API takes it, with every problem's file, line and field.

use std::collections::HashSet;
use std::path::Path;

use super::{join, Cx, Fields, NoLists};
use crate::error::WorkflowError;
use crate::model::SecretSource;
use crate::triggers::*;
use crate::yaml::{self, Node, Pos, Yaml};

const TOP_FIELDS: &[&str] = &["schedules", "hooks"];
const SCHEDULE_FIELDS: &[&str] = &[
    "name",
    "workflow",
    "cron",
    "timezone",
    "every",
    "input",
    "overlap",
    "catchup",
    "catchup_limit",
    "grace",
];
const HOOK_FIELDS: &[&str] = &[
    "name",
    "workflow",
    "secret",
    "unsigned",
    "signature",
    "idempotency",
    "input",
    "max_body",
];
const SIGNATURE_FIELDS: &[&str] = &[
    "header",
    "format",
    "payload",
    "encoding",
    "timestamp_header",
    "tolerance",
];
const IDEMPOTENCY_FIELDS: &[&str] = &["header", "field"];
const SECRET_FIELDS: &[&str] = &["env", "file"];

/// Reads and checks a triggers file.
pub fn load_triggers(path: &Path) -> Result<Triggers, WorkflowError> {
    let source = super::read_file(path)?;
    parse_triggers(&source, path)
}

/// Checks the text of a triggers file; `path` names it in problems.
pub fn parse_triggers(source: &str, path: &Path) -> Result<Triggers, WorkflowError> {
    let (mut cx, root) = open(source, path)?;
    let mut out = Triggers::default();
    if !matches!(root.value, Yaml::Null) {
        if let Some(f) = cx.fields(&root, "", TOP_FIELDS, "at the top of a triggers file") {
            if let Some((_, v)) = f.get("schedules") {
                let mut names = HashSet::new();
                for (i, item) in cx.list(v, "schedules").iter().enumerate() {
                    let field = format!("schedules[{i}]");
                    if let Some(s) = cx.schedule(item, &field) {
                        if !names.insert(s.name.clone()) {
                            cx.at(
                                item.pos,
                                Some(&field),
                                format!("a second schedule named `{}`", s.name),
                            );
                        }
                        out.schedules.push(s);
                    }
                }
            }
            if let Some((_, v)) = f.get("hooks") {
                let mut names = HashSet::new();
                for (i, item) in cx.list(v, "hooks").iter().enumerate() {
                    let field = format!("hooks[{i}]");
                    if let Some(h) = cx.hook(item, &field) {
                        if !names.insert(h.name.clone()) {
                            cx.at(
                                item.pos,
                                Some(&field),
                                format!("a second hook named `{}`", h.name),
                            );
                        }
                        out.hooks.push(h);
                    }
                }
            }
        }
    }
    cx.finish(out)
}

/// Checks one schedule's definition, as `POST /v1/schedules` takes it (JSON
/// is YAML) and as the store keeps it ([`ScheduleDef::to_json`]).
pub fn parse_schedule(source: &str, origin: &Path) -> Result<ScheduleDef, WorkflowError> {
    let (mut cx, root) = open(source, origin)?;
    let s = cx.schedule(&root, "");
    match s {
        Some(s) => cx.finish(s),
        None => {
            if cx.problem_count() == 0 {
                cx.at(root.pos, None, "not a schedule");
            }
            Err(cx.into_error())
        }
    }
}

fn open(source: &str, path: &Path) -> Result<(Cx, Node), WorkflowError> {
    let mut cx = Cx::new(path);
    if source.len() as u64 > crate::limits::MAX_FILE_BYTES {
        cx.at(Pos::default(), None, "the file is too large");
        return Err(cx.into_error());
    }
    match yaml::load(source, &mut NoLists) {
        Ok(root) => Ok((cx, root)),
        Err(e) => {
            let message = if e.limit {
                e.message
            } else {
                format!("YAML syntax error: {}", e.message)
            };
            cx.at(e.pos, e.field.as_deref(), message);
            Err(cx.into_error())
        }
    }
}

impl Cx {
    fn finish<T>(mut self, value: T) -> Result<T, WorkflowError> {
        if self.problem_count() == 0 {
            Ok(value)
        } else {
            self.problems
                .sort_by_key(|p| (p.line.unwrap_or(0), p.column.unwrap_or(0)));
            Err(self.into_error())
        }
    }

    fn list<'n>(&mut self, node: &'n Node, field: &str) -> &'n [Node] {
        match &node.value {
            Yaml::Seq(items) if items.len() <= MAX_TRIGGERS => items,
            Yaml::Seq(_) => {
                self.at(
                    node.pos,
                    Some(field),
                    format!("more than {MAX_TRIGGERS} entries"),
                );
                &[]
            }
            Yaml::Null => &[],
            other => {
                self.at(
                    node.pos,
                    Some(field),
                    format!("expected a list, found {}", other.type_name()),
                );
                &[]
            }
        }
    }

    fn trigger_name(&mut self, f: &Fields, node: &Node, field: &str, what: &str) -> Option<String> {
        let Some((_, v)) = f.get("name") else {
            self.at(node.pos, Some(field), format!("a {what} needs a `name`"));
            return None;
        };
        let nf = join(field, "name");
        let name = self.string(v, &nf)?;
        if !is_trigger_name(&name) {
            self.at_hint(
                v.pos,
                Some(&nf),
                format!("`{name}` is not a {what} name"),
                Some("use 1 to 64 lower-case letters, digits, `-` and `_`".into()),
            );
            return None;
        }
        Some(name)
    }

    fn workflow_ref(&mut self, f: &Fields, node: &Node, field: &str) -> Option<String> {
        let Some((_, v)) = f.get("workflow") else {
            self.at(
                node.pos,
                Some(field),
                "needs a `workflow` (a name in the server's workflows folder)",
            );
            return None;
        };
        let wf = join(field, "workflow");
        let name = self.string(v, &wf)?;
        if name.is_empty()
            || name.starts_with('/')
            || name.split('/').any(|s| s.is_empty() || s.starts_with('.'))
        {
            self.at(
                v.pos,
                Some(&wf),
                format!("`{name}` is not a workflow's name"),
            );
            return None;
        }
        Some(name)
    }

    fn schedule(&mut self, node: &Node, field: &str) -> Option<ScheduleDef> {
        let before = self.problem_count();
        let f = self.fields(node, field, SCHEDULE_FIELDS, "in a schedule")?;
        let name = self.trigger_name(&f, node, field, "schedule");
        let workflow = self.workflow_ref(&f, node, field);
        let timing = match (f.get("cron"), f.get("every")) {
            (Some(_), Some((k, _))) => {
                self.at(
                    k.pos,
                    Some(&join(field, "every")),
                    "give `cron` or `every`, not both",
                );
                None
            }
            (None, None) => {
                self.at_hint(
                    node.pos,
                    (!field.is_empty()).then_some(field),
                    "a schedule needs `cron` or `every`",
                    Some(
                        "`cron: \"0 */5 * * * *\"` (seconds first, optional) or `every: 30s`"
                            .into(),
                    ),
                );
                None
            }
            (Some((_, c)), None) => {
                let cf = join(field, "cron");
                let expr = self.string(c, &cf);
                let tz = match f.get("timezone") {
                    Some((_, t)) => self.string(t, &join(field, "timezone")),
                    None => Some("UTC".into()),
                };
                match (expr, tz) {
                    (Some(e), Some(t)) => match Timing::cron(&e, &t) {
                        Ok(t) => Some(t),
                        Err(m) => {
                            let at = if m.contains("time zone") {
                                f.get("timezone").map_or(c.pos, |(_, v)| v.pos)
                            } else {
                                c.pos
                            };
                            let af = if m.contains("time zone") {
                                join(field, "timezone")
                            } else {
                                cf
                            };
                            self.at(at, Some(&af), m);
                            None
                        }
                    },
                    _ => None,
                }
            }
            (None, Some((_, e))) => {
                let ef = join(field, "every");
                if let Some((k, _)) = f.get("timezone") {
                    self.at(
                        k.pos,
                        Some(&join(field, "timezone")),
                        "`timezone` goes with `cron`",
                    );
                }
                match self.duration(e, &ef) {
                    Some(d) if d < MIN_EVERY || d.subsec_millis() != 0 => {
                        self.at(e.pos, Some(&ef), "`every` is at least 1s, in whole seconds");
                        None
                    }
                    Some(d) => Some(Timing::Every(d)),
                    None => None,
                }
            }
        };
        let input = f.get("input").map(|(_, v)| {
            self.check_templates_in(v, &join(field, "input"));
            v.to_json()
        });
        let overlap = match f.get("overlap") {
            None => Some(Overlap::Skip),
            Some((_, v)) => {
                let of = join(field, "overlap");
                match self.string(v, &of).as_deref() {
                    Some("skip") => Some(Overlap::Skip),
                    Some("queue_one") => Some(Overlap::QueueOne),
                    Some("allow") => Some(Overlap::Allow),
                    Some(other) => {
                        self.at(
                            v.pos,
                            Some(&of),
                            format!("`{other}` is not an overlap policy: skip, queue_one or allow"),
                        );
                        None
                    }
                    None => None,
                }
            }
        };
        let catchup = match f.get("catchup") {
            None => Some(Catchup::Once),
            Some((_, v)) => {
                let cf = join(field, "catchup");
                match self.string(v, &cf).as_deref() {
                    Some("skip") => Some(Catchup::Skip),
                    Some("once") => Some(Catchup::Once),
                    Some("all") => Some(Catchup::All),
                    Some(other) => {
                        self.at(
                            v.pos,
                            Some(&cf),
                            format!("`{other}` is not a catch-up policy: skip, once or all"),
                        );
                        None
                    }
                    None => None,
                }
            }
        };
        let catchup_limit = match f.get("catchup_limit") {
            None => Some(DEFAULT_CATCHUP_LIMIT),
            Some((_, v)) => {
                let lf = join(field, "catchup_limit");
                match self.uint(v, &lf, 1) {
                    Some(n) if n <= MAX_CATCHUP_LIMIT as u64 => Some(n as u32),
                    Some(_) => {
                        self.at(v.pos, Some(&lf), format!("at most {MAX_CATCHUP_LIMIT}"));
                        None
                    }
                    None => None,
                }
            }
        };
        let grace = match f.get("grace") {
            None => Some(DEFAULT_GRACE),
            Some((_, v)) => self.duration(v, &join(field, "grace")),
        };
        if self.problem_count() > before {
            return None;
        }
        Some(ScheduleDef {
            name: name?,
            workflow: workflow?,
            timing: timing?,
            input,
            overlap: overlap?,
            catchup: catchup?,
            catchup_limit: catchup_limit?,
            grace: grace?,
        })
    }

    fn hook(&mut self, node: &Node, field: &str) -> Option<HookDef> {
        let before = self.problem_count();
        let f = self.fields(node, field, HOOK_FIELDS, "in a hook")?;
        let name = self.trigger_name(&f, node, field, "hook");
        let workflow = self.workflow_ref(&f, node, field);
        let unsigned = match f.get("unsigned") {
            Some((_, v)) => self.bool(v, &join(field, "unsigned")).unwrap_or(false),
            None => false,
        };
        let secret = match (f.get("secret"), unsigned) {
            (Some((_, v)), false) => self.hook_secret(v, &join(field, "secret")),
            (Some((k, _)), true) => {
                self.at(
                    k.pos,
                    Some(&join(field, "secret")),
                    "a hook with `unsigned: true` has no secret",
                );
                None
            }
            (None, false) => {
                self.at_hint(
                    node.pos,
                    (!field.is_empty()).then_some(field),
                    "a hook needs a `secret` to check deliveries' signatures",
                    Some("`secret: { env: HOOK_SECRET }`; `unsigned: true` takes deliveries anyone can send".into()),
                );
                None
            }
            (None, true) => None,
        };
        let signature = match f.get("signature") {
            Some((_, v)) => self.signature(v, &join(field, "signature")),
            None => Some(SignatureDef::github()),
        };
        let idempotency = match f.get("idempotency") {
            None => Some(None),
            Some((_, v)) => {
                let idf = join(field, "idempotency");
                let g = self.fields(v, &idf, IDEMPOTENCY_FIELDS, "in idempotency")?;
                match (g.get("header"), g.get("field")) {
                    (Some((_, h)), None) => self
                        .header_name(h, &join(&idf, "header"))
                        .map(|h| Some(Idempotency::Header(h))),
                    (None, Some((_, pn))) => {
                        let pf = join(&idf, "field");
                        match self.string(pn, &pf) {
                            Some(p) if p.starts_with('/') => Some(Some(Idempotency::Field(p))),
                            Some(p) => {
                                self.at(
                                    pn.pos,
                                    Some(&pf),
                                    format!("`{p}` is not a JSON pointer (`/id`, `/event/id`)"),
                                );
                                None
                            }
                            None => None,
                        }
                    }
                    _ => {
                        self.at(v.pos, Some(&idf), "give `header` or `field`, one of them");
                        None
                    }
                }
            }
        };
        let input = f.get("input").map(|(_, v)| {
            self.check_templates_in(v, &join(field, "input"));
            v.to_json()
        });
        let max_body = match f.get("max_body") {
            None => Some(DEFAULT_MAX_BODY),
            Some((_, v)) => {
                let bf = join(field, "max_body");
                match self.bytes(v, &bf) {
                    Some(n) if (1..=MAX_MAX_BODY).contains(&n) => Some(n),
                    Some(_) => {
                        self.at(
                            v.pos,
                            Some(&bf),
                            format!("between 1 byte and {MAX_MAX_BODY} bytes"),
                        );
                        None
                    }
                    None => None,
                }
            }
        };
        if self.problem_count() > before {
            return None;
        }
        Some(HookDef {
            name: name?,
            workflow: workflow?,
            secret,
            signature: signature?,
            idempotency: idempotency?,
            input,
            max_body: max_body?,
        })
    }

    fn hook_secret(&mut self, node: &Node, field: &str) -> Option<SecretSource> {
        let f = self.fields(node, field, SECRET_FIELDS, "in a hook's secret")?;
        match (f.get("env"), f.get("file")) {
            (Some((_, v)), None) => self.string(v, &join(field, "env")).map(SecretSource::Env),
            (None, Some((_, v))) => self.string(v, &join(field, "file")).map(SecretSource::File),
            _ => {
                self.at(node.pos, Some(field), "give `env` or `file`, one of them");
                None
            }
        }
    }

    fn header_name(&mut self, node: &Node, field: &str) -> Option<String> {
        let h = self.string(node, field)?;
        let ok = !h.is_empty()
            && h.len() <= 128
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            self.at(
                node.pos,
                Some(field),
                format!("`{h}` is not a header's name"),
            );
            return None;
        }
        Some(h.to_ascii_lowercase())
    }

    fn signature(&mut self, node: &Node, field: &str) -> Option<SignatureDef> {
        let before = self.problem_count();
        let f = self.fields(node, field, SIGNATURE_FIELDS, "in a signature")?;
        let mut sig = SignatureDef::github();
        if let Some((_, v)) = f.get("header") {
            if let Some(h) = self.header_name(v, &join(field, "header")) {
                sig.header = h;
            }
        }
        sig.header = sig.header.to_ascii_lowercase();
        if let Some((_, v)) = f.get("format") {
            let ff = join(field, "format");
            if let Some(s) = self.string(v, &ff) {
                match parse_sig_format(&s) {
                    Ok(p) => sig.format = p,
                    Err(m) => self.at(v.pos, Some(&ff), m),
                }
            }
        }
        if let Some((_, v)) = f.get("timestamp_header") {
            sig.timestamp_header = self.header_name(v, &join(field, "timestamp_header"));
            if sig.format.iter().any(|(_, p)| *p == SigPart::Timestamp) {
                self.at(
                    v.pos,
                    Some(&join(field, "timestamp_header")),
                    "the format already carries {timestamp}",
                );
            }
        }
        if let Some((_, v)) = f.get("payload") {
            let pf = join(field, "payload");
            if let Some(p) = self.string(v, &pf) {
                if p.matches("{body}").count() != 1 {
                    self.at(v.pos, Some(&pf), "the payload holds {body} once");
                } else if p.contains("{timestamp}") && !sig.has_timestamp() {
                    self.at(v.pos, Some(&pf), "{timestamp} is signed but neither `format` nor `timestamp_header` gives it");
                } else {
                    sig.payload = p;
                }
            }
        }
        if sig.has_timestamp() && !sig.payload.contains("{timestamp}") {
            self.at_hint(
                node.pos,
                Some(field),
                "a timestamp that is not signed proves nothing against replays",
                Some("put {timestamp} in `payload` (Stripe: `{timestamp}.{body}`)".into()),
            );
        }
        if let Some((_, v)) = f.get("encoding") {
            let ef = join(field, "encoding");
            match self.string(v, &ef).as_deref() {
                Some("hex") => sig.encoding = SigEncoding::Hex,
                Some("base64") => sig.encoding = SigEncoding::Base64,
                Some(o) => self.at(
                    v.pos,
                    Some(&ef),
                    format!("`{o}` is not an encoding: hex or base64"),
                ),
                None => {}
            }
        }
        if let Some((_, v)) = f.get("tolerance") {
            if let Some(d) = self.duration(v, &join(field, "tolerance")) {
                sig.tolerance = d;
            }
        }
        (self.problem_count() == before).then_some(sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(src: &str) -> Vec<String> {
        match parse_triggers(src, Path::new("t.yaml")) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .problems
                .iter()
                .map(|p| {
                    format!(
                        "{}:{} {}",
                        p.line.unwrap_or(0),
                        p.field.clone().unwrap_or_default(),
                        p.message
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_full_file_reads() {
        let t = parse_triggers(
            r#"
schedules:
  - name: nightly
    workflow: team/report
    cron: "0 30 2 * * *"
    timezone: Europe/Paris
    overlap: queue_one
    catchup: all
    catchup_limit: 3
    grace: 5m
    input: { day: "{{ schedule.due }}" }
  - { name: tick, workflow: ping, every: 30s }
hooks:
  - name: stripe
    workflow: billing
    secret: { file: stripe.key }
    signature:
      header: Stripe-Signature
      format: "t={timestamp},v1={signature}"
      payload: "{timestamp}.{body}"
      tolerance: 2m
    idempotency: { field: /id }
    max_body: 64KiB
  - { name: open, workflow: ping, unsigned: true }
"#,
            Path::new("t.yaml"),
        )
        .unwrap();
        assert_eq!(t.schedules.len(), 2);
        let s = &t.schedules[0];
        assert_eq!(
            (s.overlap, s.catchup, s.catchup_limit),
            (Overlap::QueueOne, Catchup::All, 3)
        );
        assert_eq!(s.grace, std::time::Duration::from_secs(300));
        assert_eq!(
            t.schedules[1].timing,
            Timing::Every(std::time::Duration::from_secs(30))
        );
        let h = &t.hooks[0];
        assert_eq!(h.signature.header, "stripe-signature");
        assert!(h.signature.has_timestamp());
        assert_eq!(h.idempotency, Some(Idempotency::Field("/id".into())));
        assert_eq!(h.max_body, 64 * 1024);
        assert!(t.hooks[1].secret.is_none());
        // The stored form reads back the same.
        let again = parse_schedule(&s.to_json().to_string(), Path::new("s")).unwrap();
        assert_eq!(&again, s);
    }

    #[test]
    fn problems_name_their_line_and_field() {
        let p = problems(
            r#"
schedules:
  - name: Bad Name
    workflow: ping
    every: 1s
  - name: both
    workflow: ping
    every: 1s
    cron: "* * * * *"
  - name: tz
    workflow: ping
    cron: "0 9 * * *"
    timezone: Mars/Base
  - name: fast
    workflow: ping
    every: 500ms
  - name: tick
    workflow: ping
    every: 1s
    overlap: sometimes
    catchup_limit: 5000
  - { name: dup, workflow: ping, every: 1s }
  - { name: dup, workflow: ping, every: 2s }
hooks:
  - name: open
    workflow: ping
  - name: ts
    workflow: ping
    secret: { env: S }
    signature: { format: "t={timestamp},v1={signature}" }
  - name: weird
    workflow: ping
    secret: { env: S }
    signature: { format: "{signature},{timestamp}" }
    idempotency: { field: id }
"#,
        );
        let has = |line: usize, needle: &str| {
            assert!(
                p.iter()
                    .any(|x| x.starts_with(&format!("{line}:")) && x.contains(needle)),
                "no `{needle}` at line {line} in {p:#?}"
            )
        };
        has(3, "not a schedule name");
        has(8, "not both");
        has(13, "time zone");
        has(16, "at least 1s");
        has(20, "sometimes");
        has(21, "at most 1000");
        has(23, "a second schedule named `dup`");
        has(25, "needs a `secret`");
        has(30, "not signed");
        has(34, "needs a prefix");
        has(35, "JSON pointer");
    }
}
