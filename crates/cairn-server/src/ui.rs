//! The web page: `/` and its files under `/ui/{file}`, built into the
//! binary so that it works offline and always matches the server's API.
//!
//! The page holds no data: it reads everything through the API with the
//! browser's session cookie (see [`crate::auth`]), so these routes need no
//! token and a browser can load the login form. Each answer forbids what
//! the page never does: scripts and styles from anywhere but this server,
//! inline scripts and styles, being framed, a `<base>` elsewhere; and it is
//! revalidated on every load (`no-cache` with an `ETag`), so an upgraded
//! server never runs with a stale page.

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// What the page's answers allow: only this server's own scripts, styles,
/// images and connections; nothing inline, no plugins, no framing.
pub(crate) const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
img-src 'self'; connect-src 'self'; font-src 'self'; object-src 'none'; \
frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// One file of the page.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

macro_rules! asset {
    ($name:literal, $ty:expr) => {
        Asset {
            name: $name,
            content_type: $ty,
            body: include_bytes!(concat!("../ui/", $name)),
        }
    };
}

/// Every file the page is made of; `/ui/{file}` serves these and no other.
const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("app.css", CSS),
    asset!("icon.svg", SVG),
    asset!("main.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("login.js", JS),
    asset!("runs.js", JS),
    asset!("run.js", JS),
    asset!("feed.js", JS),
    asset!("fold.js", JS),
    asset!("graph.js", JS),
    asset!("timeline.js", JS),
    asset!("activity.js", JS),
    asset!("node.js", JS),
    asset!("events.js", JS),
    asset!("vlist.js", JS),
    asset!("decisions.js", JS),
    asset!("schema.js", JS),
    asset!("compare.js", JS),
];

/// Each file's entity tag, from its content: computed once.
fn etags() -> &'static HashMap<&'static str, HeaderValue> {
    static TAGS: OnceLock<HashMap<&'static str, HeaderValue>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let digest = Sha256::digest(a.body);
                let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
                let tag = HeaderValue::from_str(&format!("\"{hex}\""))
                    .expect("hex digits make a header value");
                (a.name, tag)
            })
            .collect()
    })
}

/// True when `If-None-Match` names `tag` (or is `*`): the client's copy is
/// current.
fn not_modified(headers: &HeaderMap, tag: &HeaderValue) -> bool {
    let tag = tag.to_str().unwrap_or_default();
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim())
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag)
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return ApiError::not_found(format!("no file `{}` in the page", name.escape_debug()))
            .into_response();
    };
    let tag = etags()[asset.name].clone();
    let mut r = if not_modified(headers, &tag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            )],
            asset.body,
        )
            .into_response()
    };
    let h = r.headers_mut();
    h.insert(header::ETAG, tag);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // For browsers that predate `frame-ancestors`.
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("same-origin"),
    );
    r
}

/// `GET /`: the page.
pub(crate) async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// `GET /ui/{file}`: one of the page's files.
pub(crate) async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    serve(&file, &headers)
}

/// True for the paths of the page, which need no token.
pub(crate) fn is_page(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_named_once_and_typed_by_its_extension() {
        let mut names: Vec<&str> = ASSETS.iter().map(|a| a.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ASSETS.len());
        for a in ASSETS {
            let want = match a.name.rsplit('.').next() {
                Some("html") => HTML,
                Some("js") => JS,
                Some("css") => CSS,
                Some("svg") => SVG,
                other => panic!("{}: unexpected extension {other:?}", a.name),
            };
            assert_eq!(a.content_type, want, "{}", a.name);
        }
    }

    /// Every module the page imports is one the server serves, and no file
    /// holds inline script or style, which the policy would block.
    #[test]
    fn the_page_only_loads_what_is_served_and_nothing_inline() {
        for a in ASSETS {
            let text = std::str::from_utf8(a.body).unwrap();
            for line in text.lines() {
                if let Some(rest) = line.trim().strip_prefix("import ") {
                    let from = rest.rsplit("from").next().unwrap_or(rest);
                    let target = from
                        .trim()
                        .trim_end_matches(';')
                        .trim_matches(|c| c == '"' || c == '\'');
                    let file = target.trim_start_matches("./");
                    assert!(
                        ASSETS.iter().any(|x| x.name == file),
                        "{} imports {target}, which is not served",
                        a.name
                    );
                }
            }
            if a.name.ends_with(".html") {
                assert!(!text.contains("<style"), "{}: inline style", a.name);
                assert!(!text.contains(" style="), "{}: inline style", a.name);
                for tag in text.split("<script").skip(1) {
                    let head = tag.split('>').next().unwrap_or("");
                    assert!(head.contains("src="), "{}: inline script", a.name);
                }
                let handler = text.split(" on").skip(1).any(|rest| {
                    let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
                    !name.is_empty() && rest[name.len()..].starts_with('=')
                });
                assert!(!handler, "{}: inline event handler", a.name);
            }
            if a.name.ends_with(".js") {
                assert!(
                    !text.contains("localStorage") && !text.contains("sessionStorage"),
                    "{}: the page keeps nothing in web storage",
                    a.name
                );
                assert!(
                    !text.contains("document.cookie"),
                    "{}: the page never touches cookies",
                    a.name
                );
                // What a run holds (outputs, tool results, model answers)
                // is written by whoever controls the run's inputs: it goes
                // into the page as text nodes, never parsed as HTML or code.
                for sink in [
                    "innerHTML",
                    "outerHTML",
                    "insertAdjacentHTML",
                    "document.write",
                    "eval(",
                    "new Function",
                    "createContextualFragment",
                ] {
                    assert!(!text.contains(sink), "{}: uses {sink}", a.name);
                }
            }
        }
    }

    /// The text of a served file.
    fn asset_text(name: &str) -> &'static str {
        let a = ASSETS.iter().find(|a| a.name == name).expect("served");
        std::str::from_utf8(a.body).unwrap()
    }

    /// The quoted names in `text` from `start` to the first `end` after it.
    fn quoted_between<'t>(text: &'t str, start: &str, end: &str) -> Vec<&'t str> {
        let from = text.find(start).unwrap_or_else(|| panic!("no `{start}`")) + start.len();
        let list = &text[from..from + text[from..].find(end).expect("list ends")];
        list.split('\'').skip(1).step_by(2).collect()
    }

    /// The page's fold of events (`fold.js`, the run model every view
    /// redraws from) decides about every event type of the contract: a
    /// `case` it handles, or a name in its `IGNORED_EVENTS`. JavaScript is
    /// not compiled, so this is where a new event type points at the page.
    #[test]
    fn the_pages_fold_names_every_event_type() {
        use cairn_events::EventType;
        use std::collections::BTreeSet;
        let text = asset_text("fold.js");
        let handled: BTreeSet<&str> = text
            .split("case '")
            .skip(1)
            .map(|rest| &rest[..rest.find('\'').expect("closing quote")])
            .collect();
        let ignored = quoted_between(text, "IGNORED_EVENTS = new Set([", "]);");
        let ignored_set: BTreeSet<&str> = ignored.iter().copied().collect();
        assert_eq!(
            ignored.len(),
            ignored_set.len(),
            "fold.js: a type ignored twice"
        );
        for t in EventType::ALL {
            let name = t.as_str();
            match (handled.contains(name), ignored_set.contains(name)) {
                (true, true) => panic!("fold.js both handles and ignores {name}"),
                (false, false) => panic!(
                    "fold.js neither handles {name} (a `case` of RunModel.applyOne) nor lists it in IGNORED_EVENTS"
                ),
                _ => {}
            }
        }
        for name in handled.iter().chain(&ignored_set) {
            assert!(
                name.parse::<EventType>().is_ok(),
                "fold.js names `{name}`, which is not an event type of the contract"
            );
        }
    }

    #[test]
    fn if_none_match_is_read_like_http_says() {
        let tag = HeaderValue::from_static("\"abc\"");
        let mut h = HeaderMap::new();
        assert!(!not_modified(&h, &tag));
        h.insert(header::IF_NONE_MATCH, "\"x\", W/\"abc\"".parse().unwrap());
        assert!(not_modified(&h, &tag));
        h.insert(header::IF_NONE_MATCH, "*".parse().unwrap());
        assert!(not_modified(&h, &tag));
        h.insert(header::IF_NONE_MATCH, "\"abd\"".parse().unwrap());
        assert!(!not_modified(&h, &tag));
    }
}
