//! The web page of `cairn serve` in a real headless Chromium, driven
//! through chromedriver (WebDriver): a run started from the page, watched
//! live in the graph through a server restart and a reload, its gate
//! approved with the keyboard, its question answered through the generated
//! form (a wrong answer refused there first), then its event log read back
//! whole; the login flow with a token and the cookie it leaves; pages of
//! other origins refused; the page at a phone's width; and a run of 10,000
//! nodes and 100,000 events, measured.
//!
//! Without chromedriver or Chromium, each test prints `skipped: ...` and
//! passes (CI installs both, so nothing skips there). Screenshots of each
//! state go to `target/ui-screenshots/`, and with `CAIRN_UI_DOCS=1` also to
//! `docs/ui/`, which `docs/ui.md` shows.

mod common;
use common::free_port;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_client::{wait_healthy, Client};
use fantoccini::key::Key;
use fantoccini::{ClientBuilder, Locator};
use serde_json::{json, Value};

/// Longest any wait for the page takes before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// One Chromium at a time: the tests share a machine with few cores, and
/// a browser is the heaviest thing they start.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A child process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Chromium binary, if this machine has one.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CAIRN_CHROMIUM") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    [
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        "/usr/bin/google-chrome",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// chromedriver, if this machine has it.
fn chromedriver() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CAIRN_CHROMEDRIVER") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromedriver"))
            .find(|p| p.is_file())
    })
}

/// chromedriver in a process group of its own, with the browsers it
/// starts: all of them are killed when the test ends, even by a panic
/// (a browser whose chromedriver dies alone would live on).
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child's process group, which it leads.
        unsafe {
            libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// A headless Chromium under chromedriver, and its WebDriver session.
struct Browser {
    c: fantoccini::Client,
    _driver: Driver,
}

impl Browser {
    /// A browser whose window is `width` × `height`; `None` (having said
    /// `skipped: ...`) on a machine without chromedriver or Chromium.
    async fn start(test: &str, width: u32, height: u32) -> Option<Browser> {
        let (Some(driver), Some(chrome)) = (chromedriver(), chromium()) else {
            println!("skipped: {test}: chromedriver or Chromium is not installed (apt-get install chromium chromium-driver)");
            return None;
        };
        let port = free_port();
        let driver = Driver(
            Command::new(driver)
                .arg(format!("--port={port}"))
                .process_group(0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start chromedriver"),
        );
        let url = format!("http://127.0.0.1:{port}");
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chrome,
                "args": [
                    "--headless=new",
                    // CI runs as root, where Chromium's sandbox cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--enable-precise-memory-info",
                    "--lang=en-US",
                    format!("--window-size={width},{height}"),
                ],
            }),
        );
        let t0 = Instant::now();
        let c = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no WebDriver session from chromedriver: {e}"),
            }
        };
        c.set_window_size(width, height).await.unwrap();
        Some(Browser { c, _driver: driver })
    }

    /// Runs `script` (a function body) in the page and returns its value.
    async fn js(&self, script: &str) -> Value {
        self.c.execute(script, vec![]).await.unwrap()
    }

    /// Polls `script` until it returns something truthy, and returns that.
    async fn wait(&self, what: &str, script: &str) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.c.execute(script, vec![]).await.unwrap_or(Value::Null);
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return v;
            }
            if t0.elapsed() > PATIENCE {
                let text = self
                    .js("return document.body.innerText.slice(0, 3000)")
                    .await;
                panic!(
                    "timed out waiting for {what}; the page says:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no `{css}` on the page: {e}"))
    }

    /// Saves a screenshot of the window as `name.png`.
    async fn shot(&self, name: &str) {
        // Let the last batch of events and the layout settle.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let png = self.c.screenshot().await.unwrap();
        save_screenshot(name, &png);
    }

    /// Controls without a name a screen reader could say: none expected.
    async fn unlabelled(&self) -> Vec<String> {
        let v = self
            .js(r#"
            const bad = [];
            for (const el of document.querySelectorAll('input, select, textarea, button, progress, [role=tab], [tabindex="0"]')) {
              if (el.type === 'hidden' || el.closest('[hidden]') || !el.getClientRects().length) continue;
              let name = (el.getAttribute('aria-label') || '').trim();
              if (!name && el.labels) name = [...el.labels].map((l) => l.textContent).join(' ').trim();
              const by = el.getAttribute('aria-labelledby');
              if (!name && by) name = by.split(' ').map((id) => (document.getElementById(id) || {}).textContent || '').join(' ').trim();
              if (!name && (el.tagName === 'BUTTON' || el.getAttribute('role') === 'tab')) name = el.textContent.trim();
              if (!name) bad.push(el.outerHTML.slice(0, 160));
            }
            return bad;
            "#)
            .await;
        serde_json::from_value(v).unwrap()
    }

    /// Whether the page scrolls sideways (it must not, at any width).
    async fn scrolls_sideways(&self) -> Value {
        self.js("const d = document.documentElement; return d.scrollWidth > d.clientWidth + 1 ? {scrollWidth: d.scrollWidth, clientWidth: d.clientWidth} : false").await
    }

    async fn close(self) {
        let _ = self.c.close().await;
    }
}

/// The workspace's root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes a screenshot to `target/ui-screenshots/` (and `docs/ui/` with
/// `CAIRN_UI_DOCS=1`).
fn save_screenshot(name: &str, png: &[u8]) {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let mut dirs = vec![target.join("ui-screenshots")];
    if std::env::var("CAIRN_UI_DOCS").as_deref() == Ok("1") {
        dirs.push(workspace().join("docs/ui"));
    }
    for d in dirs {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("{name}.png")), png).unwrap();
    }
}

/// `cairn serve` on `port` over the store in `dir`, starting the workflows
/// of `dir`, with `token` if given.
fn serve(dir: &Path, port: u16, token: Option<&str>) -> Killed {
    let store = dir.join("cairn.db");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
    cmd.args(["--store", store.to_str().unwrap(), "serve"])
        .arg("--addr")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--workflows")
        .arg(dir)
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_LOG_DIR")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    Killed(cmd.spawn().expect("start cairn serve"))
}

/// A workflow with a bit of everything the page shows: a value, a command
/// that streams until the test lets it end, an agent (scripted model, one
/// tool call), an approval gate, a question with a schema, a `for_each`, a
/// child run.
const E2E: &str = r#"
name: e2e
description: What the browser test watches.
models:
  demo:
    provider: scripted
    script: turns.yaml
    price: { input: 3.00, output: 15.00 }
nodes:
  - id: greet
    value: "hello"
  - id: hold
    command: ["sh", "-c", "i=0; while [ ! -f go ]; do i=$((i+1)); echo tick $i; sleep 0.1; done; echo held"]
  - id: agent
    needs: [greet]
    agent:
      model: demo
      prompt: "Read the notes and say what they say."
      tools: [read]
      max_steps: 4
  - id: gate
    needs: [hold, agent]
    stage: ship
    approval: "Ship the release?"
  - id: pick
    needs: [gate]
    stage: ship
    ask: "Which branch, and how many copies?"
    schema:
      type: object
      required: [branch, copies]
      properties:
        branch: { type: string, enum: [main, release] }
        copies: { type: integer, minimum: 1, maximum: 5 }
  - id: each
    needs: [pick]
    for_each: "range(nodes.pick.output.copies) | list"
    nodes:
      - id: show
        value: "copy {{ item }}"
  - id: notify
    needs: [pick]
    workflow: child.yaml
    input: { branch: "{{ nodes.pick.output.branch }}" }
  - id: done
    needs: [each, notify]
    value: "{{ nodes.pick.output.branch }}"
output: "{{ nodes.done.output }}"
"#;

/// The child run `notify` starts.
const CHILD: &str = r#"
name: child
nodes:
  - id: say
    value: "notified {{ input.branch }}"
output: "{{ nodes.say.output }}"
"#;

const TURNS: &str = r#"
chunk_chars: 12
chunk_delay: 10ms
turns:
  - reasoning: The notes are one small file; reading it is enough.
    text: I'll read the notes first.
    tool_calls:
      - { name: read, args: { path: notes.txt } }
    usage: { input: 120, output: 24 }
  - text: The notes say the release is ready.
    usage: { input: 180, output: 12 }
"#;

/// Script: the state of a node as the graph shows it.
fn node_status(path: &str) -> String {
    format!("return (document.querySelector('.graph [data-path=\"{path}\"]') || {{dataset: {{}}}}).dataset.status || null")
}

/// Script: whether the graph shows `path` as `status`.
fn node_is(path: &str, status: &str) -> String {
    format!("return (document.querySelector('.graph [data-path=\"{path}\"]') || {{dataset: {{}}}}).dataset.status === '{status}'")
}

/// Every seq the event log lists, row by row, read by scrolling it from
/// top to bottom (only the rows in view exist).
async fn listed_seqs(b: &Browser) -> Vec<u64> {
    b.js("const l = document.querySelector('.vlist.events'); l.scrollTop = 0; return true")
        .await;
    let mut rows = std::collections::BTreeMap::new();
    loop {
        b.wait(
            "the rows in view to load",
            "const l = document.querySelector('.vlist.events'); return l.querySelectorAll('.evrow.loading').length === 0 && l.querySelectorAll('[data-seq]').length > 0",
        )
        .await;
        // Each row's place in the list (from its offset) and the seq it shows.
        let v = b
            .js(r#"
            const l = document.querySelector('.vlist.events');
            const rows = [];
            for (const el of l.querySelectorAll('[data-seq]')) {
              const row = el.parentElement;
              rows.push([Math.round(row.offsetTop + new DOMMatrix(getComputedStyle(row).transform).m42), Number(el.dataset.seq)]);
            }
            const end = l.scrollTop + l.clientHeight >= l.scrollHeight - 1;
            l.scrollTop = l.scrollTop + l.clientHeight;
            return {rows, end};
            "#)
            .await;
        for r in v["rows"].as_array().unwrap() {
            let (y, seq) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
            if let Some(old) = rows.insert(y, seq) {
                assert_eq!(old, seq, "the row at {y}px changed its seq");
            }
        }
        if v["end"] == true {
            return rows.into_values().collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_started_watched_decided_and_read_back_in_the_browser() {
    let _one = ONE_BROWSER.lock().await;
    let Some(b) = Browser::start("browser run", 1400, 1000).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("e2e.yaml"), E2E).unwrap();
    std::fs::write(d.join("turns.yaml"), TURNS).unwrap();
    std::fs::write(d.join("child.yaml"), CHILD).unwrap();
    std::fs::write(d.join("notes.txt"), "The release is ready.\n").unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = serve(d, port, None);
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    let api = Client::new(&url, None).unwrap();

    // The runs list, empty, and a run started from its form.
    b.c.goto(&format!("{url}/")).await.unwrap();
    b.wait(
        "the runs list",
        "return document.querySelector('.runs-table') !== null",
    )
    .await;
    b.find(".start-box summary").await.click().await.unwrap();
    b.find("#start-workflow")
        .await
        .send_keys("e2e")
        .await
        .unwrap();
    b.shot("start-a-run").await;
    b.find("form.start button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    let run = b
        .wait(
            "the run's page",
            "return location.hash.startsWith('#/runs/') && document.querySelector('.run[data-rendered]') ? decodeURIComponent(location.hash.split('/')[2]) : null",
        )
        .await
        .as_str()
        .unwrap()
        .to_string();

    // Nodes go live in the graph.
    b.wait("`hold` running", &node_is("hold", "running")).await;
    b.wait("the agent finished", &node_is("agent", "finished"))
        .await;
    b.wait(
        "the live connection",
        "return document.getElementById('conn').dataset.state === 'live'",
    )
    .await;
    b.shot("run-live").await;

    // The server dies under the page: it says so, and reconnects from its
    // last seq to the server started again (which resumes the run).
    drop(server);
    b.wait(
        "the page to notice the drop",
        "return document.getElementById('conn').dataset.state === 'reconnecting'",
    )
    .await;
    b.shot("reconnecting").await;
    server = serve(d, port, None);
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    b.wait(
        "the connection back",
        "return document.getElementById('conn').dataset.state === 'live'",
    )
    .await;
    b.wait("`hold` running again", &node_is("hold", "running"))
        .await;

    // A reload in the middle of the run, while `hold` streams its output.
    let before: u64 = b
        .js("return Number(document.querySelector('.run').dataset.lastSeq || 0)")
        .await
        .as_u64()
        .unwrap();
    b.c.refresh().await.unwrap();
    b.wait(
        "the run's page again",
        "return document.querySelector('.run[data-rendered]') !== null",
    )
    .await;
    b.wait(
        "new events after the reload",
        &format!(
            "return Number(document.querySelector('.run').dataset.lastSeq || 0) > {before} + 5"
        ),
    )
    .await;

    // `hold` ends; the gate waits; it is approved with the keyboard only.
    std::fs::write(d.join("go"), "").unwrap();
    b.wait(
        "the gate",
        "return document.querySelector('.decisions:not([hidden]) .gate') !== null",
    )
    .await;
    b.shot("gate-waiting").await;
    let note = b.find(".gate textarea").await;
    note.click().await.unwrap();
    note.send_keys(&format!("ship it{}", Key::Tab))
        .await
        .unwrap();
    let focused = b.c.active_element().await.unwrap();
    assert_eq!(
        focused.attr("data-action").await.unwrap().as_deref(),
        Some("approve"),
        "Tab from the note reaches Approve"
    );
    focused.send_keys(&Key::Enter.to_string()).await.unwrap();
    b.wait("the gate approved", &node_is("gate", "finished"))
        .await;

    // The question's form: a wrong answer is refused by the form itself
    // (the question stays open on the server), then a right one is sent.
    b.wait(
        "the question",
        "return document.querySelector('.decisions .question') !== null",
    )
    .await;
    b.find(".question select")
        .await
        .select_by_label("release")
        .await
        .unwrap();
    let copies = b.find(".question input[inputmode=numeric]").await;
    copies.send_keys("9").await.unwrap();
    b.find(".question button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    let refusal = b
        .wait("the form's refusal", "const e = document.querySelector('.question .field-error:not([hidden])'); return e && e.textContent")
        .await;
    assert!(refusal.as_str().unwrap().contains("at most 5"), "{refusal}");
    assert_eq!(
        copies.attr("aria-invalid").await.unwrap().as_deref(),
        Some("true")
    );
    b.shot("question-refused").await;
    let state = api.get_json(&format!("/v1/runs/{run}")).await.unwrap();
    assert_eq!(
        state["status"], "waiting-input",
        "the wrong answer never left the page"
    );
    copies.clear().await.unwrap();
    copies.send_keys("2").await.unwrap();
    b.find(".question button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    b.wait(
        "the run finished",
        "return document.querySelector('.run[data-status=finished]') !== null",
    )
    .await;
    b.wait(
        "the decisions gone",
        "return document.querySelector('.decisions[hidden]') !== null",
    )
    .await;
    b.shot("run-finished").await;
    let state = api.get_json(&format!("/v1/runs/{run}")).await.unwrap();
    assert_eq!(state["status"], "finished");
    assert_eq!(state["output"], "release");
    let last_seq = state["lastSeq"].as_u64().unwrap();
    assert_eq!(
        b.js("return Number(document.querySelector('.run').dataset.lastSeq)")
            .await
            .as_u64(),
        Some(last_seq),
        "the page folded every event up to the last"
    );
    // Every node's state on the page is the server's.
    for n in state["nodes"].as_array().unwrap() {
        let id = n["nodeId"].as_str().unwrap();
        if id.contains('[') {
            continue;
        }
        let shown = b.js(&node_status(id)).await;
        assert_eq!(shown, n["status"], "node {id}");
    }

    // The agent's panel: its steps, streamed text and reasoning, the tool
    // call with its arguments and result, tokens and cost.
    b.find(".gnode[data-path=\"agent\"]")
        .await
        .click()
        .await
        .unwrap();
    b.wait(
        "the agent's two steps and its tool call's result",
        "const p = document.querySelector('.node-panel'); return p && p.querySelectorAll('.step').length === 2 && p.textContent.includes('Result:') && p.textContent.includes('The release is ready')",
    )
    .await;
    let panel = b.find(".node-panel").await.text().await.unwrap();
    for want in [
        "Step 1",
        "read",
        "I'll read the notes first.",
        "reasoning",
        "120 tokens in",
        "Cost",
        "The notes say the release is ready.",
    ] {
        assert!(
            panel.to_lowercase().contains(&want.to_lowercase()),
            "the panel lacks {want:?}:\n{panel}"
        );
    }
    b.shot("agent-panel").await;
    b.find(".node-panel .close").await.click().await.unwrap();

    // The event log: every seq once, none missing, across the drop and the reload.
    b.find("#tab-events").await.click().await.unwrap();
    b.wait(
        "the event log",
        "return document.querySelector('.vlist.events [data-seq]') !== null",
    )
    .await;
    b.shot("events").await;
    let mut seqs = listed_seqs(&b).await;
    let listed = seqs.len();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(listed, seqs.len(), "a seq listed twice");
    assert_eq!(
        seqs,
        (1..=last_seq).collect::<Vec<_>>(),
        "the log as listed"
    );
    // Filtered by type on the server and by text here.
    b.find("#ev-type")
        .await
        .select_by_label("NodeFinished")
        .await
        .unwrap();
    b.wait(
        "the filter",
        "return /matching events$/.test(document.querySelector('.eventlog > p').textContent)",
    )
    .await;
    let matching = b.js("return [...document.querySelectorAll('.vlist.events .evrow .type')].every((t) => t.textContent === 'NodeFinished')").await;
    assert_eq!(matching, true);

    for (tab, ready) in [
        (
            "timeline",
            "return document.querySelectorAll('.tl-row').length >= 3",
        ),
        (
            "activity",
            "return document.querySelectorAll('.act').length >= 5",
        ),
    ] {
        b.find(&format!("#tab-{tab}")).await.click().await.unwrap();
        b.wait(tab, ready).await;
        b.shot(tab).await;
    }
    let bad = b.unlabelled().await;
    assert!(
        bad.is_empty(),
        "controls without a label on the run's page: {bad:#?}"
    );

    // The runs list shows the run, finished, with its numbers.
    b.c.goto(&format!("{url}/#/")).await.unwrap();
    b.wait(
        "the run in the list",
        &format!("const r = document.querySelector('tr[data-run=\"{run}\"]'); return r && r.dataset.status === 'finished' && r.textContent.includes('100%')"),
    )
    .await;
    // Its child run is listed right under it.
    let child = state["children"][0]["runId"].as_str().unwrap().to_string();
    b.wait(
        "the child run under its parent",
        &format!("const r = document.querySelector('tr[data-run=\"{run}\"]'); const n = r && r.nextElementSibling; return n && n.dataset.run === '{child}' && n.classList.contains('child')"),
    )
    .await;
    b.shot("runs").await;
    let bad = b.unlabelled().await;
    assert!(
        bad.is_empty(),
        "controls without a label on the runs list: {bad:#?}"
    );

    // A phone's width: one column, nothing wider than the screen.
    b.c.set_window_size(390, 844).await.unwrap();
    b.wait("the narrow layout", "return window.innerWidth <= 400")
        .await;
    assert_eq!(
        b.scrolls_sideways().await,
        false,
        "the runs list scrolls sideways"
    );
    b.shot("phone-runs").await;
    b.c.goto(&format!("{url}/#/runs/{run}/graph"))
        .await
        .unwrap();
    b.wait(
        "the run at a phone's width",
        "return document.querySelector('.run[data-rendered]') !== null",
    )
    .await;
    assert_eq!(
        b.scrolls_sideways().await,
        false,
        "the run's page scrolls sideways"
    );
    b.shot("phone-run").await;

    b.close().await;
    drop(server);
}

/// A page of another origin (another port of the same host: the same
/// *site*, so a `SameSite=Strict` cookie does go along) that tries to act
/// on the server with the user's session: a form that posts, and scripts
/// that fetch. Serves `/form` and `/fetch`, each page once per request.
fn evil_site(target: String, run: String) -> (u16, Arc<Mutex<bool>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(Mutex::new(false));
    let stopped = stop.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if *stopped.lock().unwrap() {
                return;
            }
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let body = if head.starts_with("GET /form") {
                format!(
                    r#"<!doctype html><form method="POST" action="{target}/v1/runs/{run}/cancel" enctype="text/plain"><input name='{{"reason":"' value='csrf"}}'></form><script>document.forms[0].submit()</script>"#
                )
            } else {
                format!(
                    r#"<!doctype html><title>pending</title><script>
                    const results = [];
                    const tries = [
                      fetch("{target}/v1/runs/{run}/cancel", {{method: "POST", credentials: "include", headers: {{"Content-Type": "application/json"}}, body: "{{}}"}}),
                      fetch("{target}/v1/runs/{run}/cancel", {{method: "POST", credentials: "include", mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: "{{}}"}}),
                      fetch("{target}/v1/runs", {{credentials: "include"}}).then((r) => r.text()),
                    ];
                    Promise.allSettled(tries).then((rs) => {{
                      document.title = JSON.stringify(rs.map((r) => r.status === "fulfilled" ? (typeof r.value === "string" ? "read:" + r.value.slice(0, 40) : "sent:" + r.value.type + ":" + r.value.status) : "refused"));
                    }});
                    </script>"#
                )
            };
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_server_asks_for_a_login_keeps_it_in_an_httponly_cookie_and_refuses_other_sites() {
    let _one = ONE_BROWSER.lock().await;
    let Some(b) = Browser::start("browser login", 1400, 1000).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("wait.yaml"),
        "name: wait\nnodes:\n  - id: hold\n    command: [\"sh\", \"-c\", \"while [ ! -f go ]; do sleep 0.1; done\"]\n",
    )
    .unwrap();
    let token = "correct-horse-battery-staple";
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = serve(d, port, Some(token));
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    let api = Client::new(&url, Some(token.to_string())).unwrap();
    let run = api
        .post_json("/v1/runs", &json!({"workflow": "wait"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();

    // The page loads without a token and asks for one.
    b.c.goto(&format!("{url}/")).await.unwrap();
    b.wait(
        "the login form",
        "return document.getElementById('login-token') !== null",
    )
    .await;
    b.shot("login").await;
    let bad = b.unlabelled().await;
    assert!(
        bad.is_empty(),
        "controls without a label on the login form: {bad:#?}"
    );

    // A wrong token is refused, and leaves no cookie.
    b.find("#login-token")
        .await
        .send_keys("wrong-token")
        .await
        .unwrap();
    b.find("form.login button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    b.wait(
        "the refusal",
        "return document.querySelector('.login .form-status').textContent.includes('wrong')",
    )
    .await;
    b.shot("login-refused").await;
    assert!(b
        .c
        .get_all_cookies()
        .await
        .unwrap()
        .iter()
        .all(|c| c.name() != "cairn_session"));

    // The right one: the runs list, with the run, through the cookie.
    b.find("#login-token").await.send_keys(token).await.unwrap();
    b.find("form.login button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    b.wait(
        "the runs list after the login",
        &format!("return document.querySelector('tr[data-run=\"{run}\"]') !== null"),
    )
    .await;
    assert_eq!(
        b.js("return document.cookie.includes('cairn_session')")
            .await,
        false,
        "scripts cannot read the session cookie"
    );
    assert_eq!(
        b.js("return document.getElementById('login-token')").await,
        Value::Null,
        "the token's field is gone"
    );
    let cookies = b.c.get_all_cookies().await.unwrap();
    let session = cookies
        .iter()
        .find(|c| c.name() == "cairn_session")
        .expect("a session cookie");
    assert_eq!(session.http_only(), Some(true));
    assert_eq!(format!("{:?}", session.same_site()), "Some(Strict)");
    assert_ne!(session.value(), token, "the cookie is not the token");
    assert!(!session.value().contains(token));
    assert_eq!(session.value().len(), 64);
    let bad = b.unlabelled().await;
    assert!(
        bad.is_empty(),
        "controls without a label on the runs list: {bad:#?}"
    );

    // Another origin's pages cannot act with the session: a cross-site form
    // POST and foreign-Origin fetches are refused, and none is readable.
    let (evil, stop) = evil_site(url.clone(), run.clone());
    b.c.goto(&format!("http://127.0.0.1:{evil}/form"))
        .await
        .unwrap();
    let refused = b
        .wait("the form's answer", "return document.body && document.body.innerText.includes('error') ? document.body.innerText : null")
        .await;
    assert!(
        refused.as_str().unwrap().contains("origin_not_allowed"),
        "{refused}"
    );
    b.c.goto(&format!("http://127.0.0.1:{evil}/fetch"))
        .await
        .unwrap();
    let outcome = b
        .wait(
            "the fetches",
            "return document.title !== 'pending' && document.title",
        )
        .await;
    let outcome: Vec<String> = serde_json::from_str(outcome.as_str().unwrap()).unwrap();
    assert_eq!(
        outcome[0], "refused",
        "a JSON POST from another origin needs a preflight, which fails"
    );
    assert!(
        outcome[1] == "refused" || outcome[1].starts_with("sent:opaque"),
        "{outcome:?}"
    );
    assert_eq!(outcome[2], "refused", "another origin cannot read the API");
    *stop.lock().unwrap() = true;
    let state = api.get_json(&format!("/v1/runs/{run}")).await.unwrap();
    assert_eq!(state["status"], "running", "no cancel went through");
    assert!(state.get("cancelRequested").is_none(), "{state}");

    // Logging out ends the session.
    b.c.goto(&format!("{url}/")).await.unwrap();
    b.wait(
        "the log-out button",
        "return !document.getElementById('logout').hidden",
    )
    .await;
    b.find("#logout").await.click().await.unwrap();
    b.wait(
        "the login form again",
        "return document.getElementById('login-token') !== null",
    )
    .await;
    assert!(b
        .c
        .get_all_cookies()
        .await
        .unwrap()
        .iter()
        .all(|c| c.name() != "cairn_session"));
    std::fs::write(d.join("go"), "").unwrap();
    b.close().await;
}

/// Writes a finished run of `layers` × `width` value nodes (each needing
/// the one before it) with `total` events in all, straight into the store
/// the way the engine would: the plan, layers, chapters, each node pending,
/// started, streaming output and finished.
fn big_run(dir: &Path, run: &str, layers: usize, width: usize, total: u64) {
    use cairn_events::{EventKind, OutputStream, Scope};
    use cairn_store::{Journal, JournalOptions, RunRecord};
    let mut yaml = String::from("name: big\nnodes:\n");
    for l in 0..layers {
        for i in 0..width {
            yaml.push_str(&format!(
                "  - id: n{l}_{i}\n    value: {i}\n    stage: part{}\n",
                l / 10
            ));
            if l > 0 {
                yaml.push_str(&format!("    needs: [n{}_{i}]\n", l - 1));
            }
        }
    }
    std::fs::write(dir.join("big.yaml"), &yaml).unwrap();
    let journal = Journal::open_sqlite(&dir.join("cairn.db"), JournalOptions::default()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    journal
        .backend()
        .create_run(&RunRecord {
            run_id: cairn_events::RunId::parse(run).unwrap(),
            workflow: "big".into(),
            workflow_path: dir.join("big.yaml").display().to_string(),
            workflow_hash: "0".repeat(64),
            workflow_source: yaml,
            input: json!({}),
            status: cairn_store::RecordStatus::Run(cairn_events::RunStatus::Running),
            created_ms: now,
            updated_ms: now,
            parent_run_id: None,
        })
        .unwrap();
    let log = journal
        .run_log(&cairn_events::RunId::parse(run).unwrap())
        .unwrap();
    let nodes = (layers * width) as u64;
    let chapters = layers.div_ceil(10) as u64;
    // Everything but the streamed output: the rest of the budget is output.
    let fixed = 2 + 2 * layers as u64 + 2 * chapters + 3 * nodes + 1;
    let mut outputs = total - fixed;
    log.append(
        Scope::run(),
        EventKind::RunStarted {
            workflow: "big".into(),
            workflow_hash: "0".repeat(64),
            input: None,
            resumed: false,
            parent_run_id: None,
            parent_node_id: None,
            depth: 0,
            forked_from: None,
            trigger: None,
            replay_of: None,
        },
    );
    log.append(
        Scope::run(),
        EventKind::FrameCommitted {
            frame_no: 1,
            xml_hash: "0".repeat(64),
            mounted: nodes,
        },
    );
    for l in 0..layers {
        for i in 0..width {
            let id = format!("n{l}_{i}");
            log.append(
                Scope::node(id.as_str(), 0),
                EventKind::NodePending {
                    layer_index: Some(l as u32),
                },
            );
        }
    }
    for l in 0..layers {
        let chapter = format!("part{}", l / 10);
        if l % 10 == 0 {
            log.append(
                Scope::run(),
                EventKind::ChapterStarted {
                    chapter: chapter.clone(),
                },
            );
        }
        log.append(
            Scope::run(),
            EventKind::LayerStarted {
                layer_index: l as u32,
                node_count: width as u64,
            },
        );
        for i in 0..width {
            let id = format!("n{l}_{i}");
            let scope = Scope::node(id.as_str(), 0)
                .with_attempt(1)
                .with_chapter(Some(chapter.clone()));
            log.append(scope.clone(), EventKind::NodeStarted { snapshot: None });
            let left = (layers - l) as u64 * width as u64 - i as u64;
            let mine = outputs / left;
            outputs -= mine;
            for k in 0..mine {
                log.append(
                    scope.clone(),
                    EventKind::NodeOutput {
                        text: format!("working on {id}: step {k}\n"),
                        stream: OutputStream::Stdout,
                    },
                );
            }
            log.append(
                scope,
                EventKind::NodeFinished {
                    duration_ms: 3,
                    output: Some(cairn_events::Output::new(&std::sync::Arc::new(json!(i)))),
                    cached: None,
                    snapshot: None,
                },
            );
        }
        log.append(
            Scope::run(),
            EventKind::LayerFinished {
                layer_index: l as u32,
                duration_ms: 3,
                succeeded: width as u64,
                failed: 0,
                skipped: 0,
                cancelled: 0,
            },
        );
        if l % 10 == 9 || l == layers - 1 {
            log.append(
                Scope::run(),
                EventKind::ChapterFinished {
                    chapter,
                    status: "finished".into(),
                },
            );
        }
    }
    log.append(
        Scope::run(),
        EventKind::RunFinished {
            output: None,
            duration_ms: 1000,
        },
    );
    log.sync_blocking().unwrap();
    assert_eq!(log.last_seq(), total);
    drop(log);
    journal.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_10000_nodes_and_100000_events_renders_with_a_bounded_dom() {
    let _one = ONE_BROWSER.lock().await;
    if chromedriver().is_none() || chromium().is_none() {
        println!("skipped: browser big run: chromedriver or Chromium is not installed (apt-get install chromium chromium-driver)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let t0 = Instant::now();
    big_run(d, "big", 50, 200, 100_000);
    println!(
        "wrote 10,000 nodes and 100,000 events in {:?}",
        t0.elapsed()
    );
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = serve(d, port, None);
    wait_healthy(&url, Duration::from_secs(60)).await.unwrap();
    let Some(b) = Browser::start("browser big run", 1400, 1000).await else {
        return;
    };

    b.c.goto(&format!("{url}/#/runs/big/graph")).await.unwrap();
    b.wait(
        "the big run's page",
        "return document.querySelector('.run[data-rendered]') !== null",
    )
    .await;
    let rendered_at = "const m = performance.getEntriesByName('cairn:run-rendered')[0]; return m ? m.startTime : null";
    // The first load folds the whole log on the server; a reload finds
    // the state folded already.
    let first_render = b.js(rendered_at).await.as_f64().unwrap();
    b.c.refresh().await.unwrap();
    b.wait(
        "the big run's page, reloaded",
        "return document.querySelector('.run[data-rendered]') !== null",
    )
    .await;
    let warm_render = b.js(rendered_at).await.as_f64().unwrap();
    let boxes = b
        .js("return document.querySelectorAll('.gnode, .gbox').length")
        .await
        .as_u64()
        .unwrap();
    assert!(boxes > 0 && boxes < 2000, "graph boxes in the DOM: {boxes}");
    b.shot("big-run-graph").await;

    // The graph scrolls without drawing more than what is in view.
    b.js("const v = document.querySelector('.graph-view'); v.scrollLeft = v.scrollWidth / 2; v.scrollTop = v.scrollHeight / 2; return true").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let boxes_mid = b
        .js("return document.querySelectorAll('.gnode, .gbox').length")
        .await
        .as_u64()
        .unwrap();
    assert!(
        boxes_mid > 0 && boxes_mid < 2000,
        "graph boxes in the DOM after scrolling: {boxes_mid}"
    );
    let found = b.js("document.getElementById('graph-find').value = 'n42_150'; document.querySelector('.graph-find button').click(); return true").await;
    assert_eq!(found, true);
    b.wait(
        "the node found",
        "return document.activeElement && document.activeElement.dataset.path === 'n42_150'",
    )
    .await;

    // The event log: 100,000 rows, of which only a screenful exists.
    let t_events = Instant::now();
    b.find("#tab-events").await.click().await.unwrap();
    b.wait(
        "the event log",
        "return document.querySelector('.vlist.events [data-seq]') !== null",
    )
    .await;
    let events_ms = t_events.elapsed().as_millis();
    b.js("const l = document.querySelector('.vlist.events'); l.scrollTop = l.scrollHeight / 2; return true").await;
    b.wait(
        "the middle of the log",
        "const l = document.querySelector('.vlist.events'); return l.querySelectorAll('[data-seq]').length > 10 && l.querySelectorAll('.evrow.loading').length === 0",
    )
    .await;
    let rows = b
        .js("return document.querySelectorAll('.vlist.events .vrow').length")
        .await
        .as_u64()
        .unwrap();
    assert!(rows > 10 && rows < 500, "event rows in the DOM: {rows}");
    let total = b
        .js("return [document.querySelector('.eventlog > p').textContent, document.querySelector('.vlist.events .vlist-sizer').getBoundingClientRect().height]")
        .await;
    assert_eq!(
        total,
        json!(["100000 events", 2_600_000]),
        "100,000 rows of 26 px"
    );
    b.shot("big-run-events").await;

    let dom_nodes = b
        .js("return document.getElementsByTagName('*').length")
        .await
        .as_u64()
        .unwrap();
    let heap = b
        .js("return performance.memory ? performance.memory.usedJSHeapSize : null")
        .await
        .as_f64();
    assert!(dom_nodes < 10_000, "elements in the page: {dom_nodes}");
    println!(
        "big run (10,000 nodes, 100,000 events): first render of the run view {first_render:.0} ms after navigation ({warm_render:.0} ms on a reload); event log shown in {events_ms} ms; {boxes} graph boxes, {rows} event rows, {dom_nodes} elements in the DOM; JS heap {}",
        heap.map(|h| format!("{:.1} MB", h / 1e6)).unwrap_or_else(|| "unknown".into())
    );
    b.close().await;
}

/// A switch and two failure handlers: `route` chooses `fix`, which fails,
/// so `notify` (on failure) runs, `plan` and `triage` are skipped, and
/// `report` (always) runs last.
const ROUTE: &str = r#"
name: route
nodes:
  - id: route
    switch:
      on: "'bug'"
      cases: {bug: [fix], feature: [plan]}
      default: [triage]
  - {id: fix, needs: [route], command: ["sh", "-c", "exit 3"]}
  - {id: plan, needs: [route], value: 1}
  - {id: triage, needs: [route], value: 2}
  - {id: notify, needs: [fix], if: "failure()", value: "fix failed"}
  - {id: report, needs: [fix, plan, triage], if: "always()", value: "done"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_and_its_handlers_show_in_the_graph_and_the_node_panel() {
    let _one = ONE_BROWSER.lock().await;
    let Some(b) = Browser::start("browser switch", 1400, 1000).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("route.yaml"), ROUTE).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = serve(d, port, None);
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    let api = Client::new(&url, None).unwrap();
    let run = api
        .start(&cairn_api::StartBody {
            workflow: "route".into(),
            input: None,
            run_id: Some("sw1".into()),
            max_concurrency: None,
        })
        .await
        .unwrap()
        .run_id;
    assert_eq!(run.as_str(), "sw1");

    b.c.goto(&format!("{url}/#/runs/sw1")).await.unwrap();
    b.wait("`report` finished", &node_is("report", "finished"))
        .await;
    for (id, status) in [
        ("route", "finished"),
        ("fix", "failed"),
        ("plan", "skipped"),
        ("triage", "skipped"),
        ("notify", "finished"),
    ] {
        b.wait(&format!("`{id}` {status}"), &node_is(id, status))
            .await;
    }
    // The switch's box says what it chose; the handlers' say when they run.
    let meta = |path: &str| {
        format!("return document.querySelector('.gnode[data-path=\"{path}\"] .meta').textContent")
    };
    assert_eq!(b.js(&meta("route")).await, "switch · chose bug");
    let notify = b.js(&meta("notify")).await;
    assert!(
        notify.as_str().unwrap().starts_with("if failure() · value"),
        "{notify}"
    );
    // Its edges carry the cases' labels; the handlers' edges are dashed.
    let labels = b
        .js("return [...document.querySelectorAll('.edge-labels text')].map((t) => t.textContent).sort()")
        .await;
    assert_eq!(labels, json!(["bug", "default", "feature"]));
    let dashed = b
        .js("return document.querySelector('.edge.handler').getAttribute('d')")
        .await;
    // notify's one need and report's three.
    assert_eq!(dashed.as_str().unwrap().matches('M').count(), 4, "{dashed}");
    b.shot("switch-and-handlers").await;

    // The panels say the branches, the choice and the skip's reason.
    b.find(".gnode[data-path=\"route\"]")
        .await
        .click()
        .await
        .unwrap();
    b.wait(
        "the switch's panel",
        "const p = document.querySelector('.node-panel'); return p && p.textContent.includes('Chose')",
    )
    .await;
    let panel = b.find(".node-panel").await.text().await.unwrap();
    for want in [
        "Branches",
        "bug → fix",
        "feature → plan",
        "default → triage",
        "Chose",
    ] {
        assert!(panel.contains(want), "{want:?} not in the panel:\n{panel}");
    }
    b.find(".gnode[data-path=\"plan\"]")
        .await
        .click()
        .await
        .unwrap();
    b.wait(
        "the skipped node's panel",
        "const p = document.querySelector('.node-panel'); return p && p.textContent.includes('Reason')",
    )
    .await;
    let panel = b.find(".node-panel").await.text().await.unwrap();
    assert!(panel.contains("branch"), "{panel}");
    b.find(".gnode[data-path=\"notify\"]")
        .await
        .click()
        .await
        .unwrap();
    b.wait(
        "the handler's panel",
        "const p = document.querySelector('.node-panel'); return p && p.textContent.includes('Runs if')",
    )
    .await;
}

/// A run a schedule started says so on its page; an ended run offers no
/// Resume (the server would refuse it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_run_says_what_started_it() {
    let _one = ONE_BROWSER.lock().await;
    let Some(b) = Browser::start("browser schedule", 1200, 900).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("ping.yaml"),
        "name: ping\nnodes:\n  - id: a\n    value: 1\n",
    )
    .unwrap();
    std::fs::write(
        d.join("triggers.yaml"),
        "schedules:\n  - { name: tick, workflow: ping, every: 1s }\n",
    )
    .unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = Killed(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--store", d.join("cairn.db").to_str().unwrap(), "serve"])
            .arg("--addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--workflows")
            .arg(d)
            .arg("--triggers")
            .arg(d.join("triggers.yaml"))
            .env_remove("CAIRN_TOKEN")
            .env_remove("CAIRN_LOG_DIR")
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start cairn serve"),
    );
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    let api = Client::new(&url, None).unwrap();
    let run = loop {
        let list = api
            .runs(&cairn_client::RunsQuery {
                status: Some("finished".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        if let Some(r) = list.runs.first() {
            break r.run_id.to_string();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let due: i64 = run.strip_prefix("sched-tick-").unwrap().parse().unwrap();
    b.c.goto(&format!("{url}/#/runs/{run}")).await.unwrap();
    b.wait(
        "the trigger in the run's links",
        "const l = document.querySelector('.links'); return l && l.textContent.includes('Started by schedule tick')",
    )
    .await;
    let links = b.find(".links").await.text().await.unwrap();
    assert!(links.contains("(due "), "{links}");
    let resume = b
        .js("return [...document.querySelectorAll('.actions button')].find((x) => x.textContent === 'Resume').disabled")
        .await;
    assert_eq!(resume, json!(true), "an ended run offers no Resume");
    assert!(due % 1000 == 0);
    b.shot("scheduled-run").await;
}

/// A replay's page links to the comparison with its original, which shows
/// where the two part (the changed prompt's lines) and every node side by
/// side.
#[tokio::test]
async fn a_replay_is_compared_with_its_original_node_by_node() {
    let _one = ONE_BROWSER.lock().await;
    let Some(b) = Browser::start("browser compare", 1200, 900).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wf = |prompt: &str| {
        format!(
            "name: cmp\nmodels:\n  m: {{ provider: scripted, script: turns.yaml }}\nnodes:\n  - id: first\n    value: 1\n  - id: ask\n    needs: [first]\n    agent: {{ model: m, prompt: \"{prompt}\" }}\n"
        )
    };
    std::fs::write(d.join("turns.yaml"), "turns:\n  - text: done\n").unwrap();
    std::fs::write(d.join("wf.yaml"), wf("Say done.")).unwrap();
    std::fs::write(d.join("wf2.yaml"), wf("Say it is done.")).unwrap();
    let cairn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--store", d.join("cairn.db").to_str().unwrap()])
            .args(args)
            .env_remove("CAIRN_LOG_DIR")
            .current_dir(d)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    assert!(cairn(&["run", "wf.yaml", "--run-id", "orig"])
        .status
        .success());
    let out = cairn(&[
        "replay",
        "orig",
        "--workflow",
        "wf2.yaml",
        "--run-id",
        "rep",
    ]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = Killed(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--store", d.join("cairn.db").to_str().unwrap(), "serve"])
            .arg("--addr")
            .arg(format!("127.0.0.1:{port}"))
            .env_remove("CAIRN_TOKEN")
            .env_remove("CAIRN_LOG_DIR")
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start cairn serve"),
    );
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    b.c.goto(&format!("{url}/#/runs/rep")).await.unwrap();
    b.wait(
        "the replay's link to its comparison",
        "return !!document.querySelector('.links a.compare-link')",
    )
    .await;
    b.find(".links a.compare-link").await.click().await.unwrap();
    b.wait(
        "the divergence",
        "const d = document.querySelector('.compare-divergence'); return d && d.textContent.includes('ask')",
    )
    .await;
    let del = b.find(".diff .diff-del").await.text().await.unwrap();
    let add = b.find(".diff .diff-add").await.text().await.unwrap();
    assert!(del.contains("-Say done."), "{del}");
    assert!(add.contains("+Say it is done."), "{add}");
    let rows = b
        .js("return [...document.querySelectorAll('.compare-table tbody tr')].map((r) => r.className + ':' + r.querySelector('th').textContent)")
        .await;
    assert_eq!(rows, json!(["differs:ask", "same:first"]));
    b.shot("compare").await;
}
