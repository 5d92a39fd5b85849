//! `cairn hijack` with the real binary: a person takes a running agent's
//! conversation on a pseudo-terminal while `cairn run` drives the run in
//! another process, writes a turn (the agent's tools run in the sandbox and
//! are recorded), and hands it back; the agent goes on by itself. And a
//! kill -9 of the driving process in the middle of a hijack: `cairn resume`
//! replays the person's turns from the log, makes no call twice, and the
//! session goes on where it stood.

mod common;
use common::*;

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use cairn_events::EventKind;

const WORKFLOW: &str = r#"
name: hj
models:
  m: { provider: scripted, script: turns.yaml }
nodes:
  - id: author
    agent:
      model: m
      prompt: Do the work.
      tools: [write, bash]
output: "{{ nodes.author.output }}"
"#;

/// Step 1 works a while (the person asks to take over meanwhile); steps 2
/// and 3 answer the person's turn; step 4 is the agent on its own again.
const TURNS: &str = r#"
turns:
  - text: Thinking first.
    tool_calls:
      - { name: bash, args: { argv: ["sh", "-c", "sleep 1; echo slept"] } }
  - text: Writing hello.txt as you asked.
    tool_calls:
      - { name: write, args: { path: hello.txt, content: "hello\n" } }
  - text: Wrote it.
  - text: Done by myself.
"#;

fn setup(dir: &Path) {
    std::fs::write(dir.join("hj.yaml"), WORKFLOW).unwrap();
    std::fs::write(dir.join("turns.yaml"), TURNS).unwrap();
}

/// `cairn <args>` on a new pseudo-terminal: what it prints, and the
/// terminal to type into.
struct Tty {
    child: std::process::Child,
    master: std::fs::File,
    seen: Arc<Mutex<String>>,
}

impl Tty {
    fn spawn(dir: &Path, args: &[&str]) -> Tty {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty fills two descriptors we then own.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both came from openpty just now and nothing else owns them.
        let (master, slave) =
            unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        // Through a server, or on the store here.
        let store: &[&str] = if args.contains(&"--server") {
            &[]
        } else {
            &["--store", ".cairn/cairn.db"]
        };
        let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .current_dir(dir)
            .args(args)
            .args(store)
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave))
            .spawn()
            .expect("start cairn");
        let master = std::fs::File::from(master);
        let seen = Arc::new(Mutex::new(String::new()));
        let (mut reader, into) = (master.try_clone().unwrap(), seen.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once every holder of the terminal has exited.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                into.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Tty {
            child,
            master,
            seen,
        }
    }

    fn text(&self) -> String {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until the terminal has shown `n` times `what`.
    fn wait_shown(&self, what: &str, n: usize) {
        wait_until(&format!("`{what}` shown {n} times"), || {
            self.text().matches(what).count() >= n
        });
    }

    fn type_line(&mut self, line: &str) {
        self.master
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
    }
}

#[test]
fn a_person_takes_the_conversation_on_a_terminal_and_hands_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let mut run = cairn_session(dir, &["run", "hj.yaml", "--run-id", "h1"]);
    wait_until("the first step's call", || {
        mirror(dir, "h1").contains("\"ToolCallStarted\"")
    });

    let mut tty = Tty::spawn(dir, &["hijack", "h1", "author"]);
    tty.wait_shown("you> ", 1);
    assert!(
        tty.text().contains("asked agent `author` to stop"),
        "{}",
        tty.text()
    );
    tty.type_line("please write hello.txt");
    tty.wait_shown("agent> Wrote it.", 1);
    tty.wait_shown("you> ", 2);
    let shown = tty.text();
    // What the person typed is echoed by the terminal, then the agent's
    // message and its call.
    assert!(shown.contains("please write hello.txt"), "{shown}");
    assert!(
        shown.contains("agent> Writing hello.txt as you asked."),
        "{shown}"
    );
    assert!(shown.contains("-> write"), "{shown}");
    assert!(shown.contains("write: success"), "{shown}");
    tty.type_line("/back");
    tty.wait_shown("handed back", 1);
    assert_eq!(wait_exit(&mut tty.child).code(), Some(0));
    assert_eq!(wait_exit(&mut run).code(), Some(0), "{}", sessions_err(dir));

    assert_eq!(
        std::fs::read_to_string(dir.join("hello.txt")).unwrap(),
        "hello\n"
    );
    let evs = events(dir, "h1");
    let kinds: Vec<String> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::RunHijackRequested { node_id, .. } => Some(format!("requested {node_id}")),
            EventKind::InputReceived { answer, .. } => {
                Some(format!("person: {}", answer.as_str().unwrap()))
            }
            EventKind::AgentStepFinished { step, .. } => Some(format!("step {step}")),
            EventKind::ToolCallStarted { tool_name, .. } => Some(format!("call {tool_name}")),
            EventKind::RunHijacked {
                engine,
                mode,
                resumed,
            } => Some(format!("hijacked {engine} {mode} resumed={resumed}")),
            EventKind::NodeFinished { output, .. } => {
                Some(format!("finished {}", output.as_ref().unwrap().to_value()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "step 1",
            "call bash",
            "requested author",
            "person: please write hello.txt",
            "step 2",
            "call write",
            "step 3",
            "person: /back",
            "hijacked cairn interactive resumed=true",
            "step 4",
            "finished \"Done by myself.\"",
        ]
    );
}

/// The same conversation with a run a server drives, taken from another
/// folder through `--server`: the request, the turns and the agent's
/// steps go over the API.
#[test]
fn a_person_takes_a_servers_agent_through_the_api() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let port = free_port();
    let mut server = serve(dir, &["--store", ".cairn/cairn.db"], port);
    wait_until("the server", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let url = format!("http://127.0.0.1:{port}");
    let elsewhere = tempfile::tempdir().unwrap();
    let start = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(elsewhere.path())
        .args(["run", "hj", "--run-id", "h5", "--server", &url])
        .env_remove("CAIRN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the first step's call", || {
        mirror(dir, "h5").contains("\"ToolCallStarted\"")
    });

    let mut tty = Tty::spawn(
        elsewhere.path(),
        &["hijack", "h5", "author", "--server", &url],
    );
    tty.wait_shown("you> ", 1);
    tty.type_line("please write hello.txt");
    tty.wait_shown("agent> Wrote it.", 1);
    tty.wait_shown("you> ", 2);
    let shown = tty.text();
    assert!(
        shown.contains("agent> Writing hello.txt as you asked."),
        "{shown}"
    );
    assert!(shown.contains("write: success"), "{shown}");
    tty.type_line("/back");
    tty.wait_shown("handed back", 1);
    assert_eq!(wait_exit(&mut tty.child).code(), Some(0), "{}", tty.text());
    let mut start = start;
    assert_eq!(wait_exit(&mut start).code(), Some(0));
    // The file is written on the server's machine, in the run's root.
    assert_eq!(
        std::fs::read_to_string(dir.join("hello.txt")).unwrap(),
        "hello\n"
    );
    let log = mirror(dir, "h5");
    assert!(log.contains("\"RunHijacked\""), "{log}");
    assert!(log.contains("please write hello.txt"), "{log}");

    // What cannot be hijacked is refused as it is locally (exit 4).
    for args in [
        &["hijack", "h5", "author", "--server", &url][..],
        &["hijack", "nope", "author", "--server", &url],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .current_dir(elsewhere.path())
            .args(args)
            .env_remove("CAIRN_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(4), "{args:?}");
    }
    // SAFETY: signalling the server this test started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    wait_exit(&mut server);
}

#[test]
fn a_kill_in_the_middle_of_a_hijack_is_replayed_by_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let mut run = cairn_session(dir, &["run", "hj.yaml", "--run-id", "h2"]);
    wait_until("the first step's call", || {
        mirror(dir, "h2").contains("\"ToolCallStarted\"")
    });
    let mut hijack = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(["hijack", "h2", "author", "--store", ".cairn/cairn.db"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    hijack
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"please write hello.txt\n")
        .unwrap();
    // The person's first turn is answered; the agent asks for the next.
    wait_until("the second question", || {
        mirror(dir, "h2").matches("\"InputRequested\"").count() >= 2
    });
    let _ = run.kill();
    wait_exit(&mut run);
    let _ = hijack.kill();
    wait_exit(&mut hijack);

    // A new process takes the run up: the conversation replays, the
    // person's turn from the log, and waits for the next turn.
    let mut resumed = cairn_session(dir, &["resume", "h2"]);
    let asked_before = mirror(dir, "h2").matches("\"InputRequested\"").count();
    let open = events(dir, "h2")
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            EventKind::InputRequested { request_id, .. } => Some(request_id.clone()),
            _ => None,
        })
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(["answer", "h2", &open, "/back", "--store", ".cairn/cairn.db"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    expect_code(&out, 0);
    assert_eq!(
        wait_exit(&mut resumed).code(),
        Some(0),
        "{}",
        sessions_err(dir)
    );
    assert!(asked_before >= 2);

    let evs = events(dir, "h2");
    let count = |f: &dyn Fn(&EventKind) -> bool| evs.iter().filter(|e| f(&e.kind)).count();
    // Nothing was done twice: one write, one answer per question, one end
    // of the hijack; steps 2 and 3 were not asked again.
    assert_eq!(
        count(
            &|k| matches!(k, EventKind::ToolCallStarted { tool_name, .. } if tool_name == "write")
        ),
        1
    );
    assert_eq!(count(&|k| matches!(k, EventKind::InputReceived { .. })), 2);
    assert_eq!(
        count(&|k| matches!(k, EventKind::RunHijacked { resumed: true, .. })),
        1
    );
    for step in [2, 3] {
        assert_eq!(
            count(&|k| matches!(k, EventKind::AgentStepStarted { step: s, .. } if *s == step)),
            1,
            "step {step}"
        );
    }
    assert!(evs.iter().any(|e| matches!(&e.kind,
        EventKind::RunFinished { output: Some(o), .. } if o == "Done by myself.")));
    assert_eq!(
        std::fs::read_to_string(dir.join("hello.txt")).unwrap(),
        "hello\n"
    );
}

#[test]
fn what_cannot_be_hijacked_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    std::fs::write(
        dir.join("cmd.yaml"),
        "name: c\nnodes:\n  - id: c\n    command: [\"sleep\", \"30\"]\n",
    )
    .unwrap();
    let mut run = cairn_session(dir, &["run", "cmd.yaml", "--run-id", "c1"]);
    wait_until("the command to start", || {
        mirror(dir, "c1").contains("\"NodeStarted\"")
    });
    for (args, says) in [
        (vec!["hijack", "c1", "c"], "it is not an agent"),
        (vec!["hijack", "c1", "nope"], "has no node `nope`"),
        (vec!["hijack", "nope", "c"], "no run `nope`"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .current_dir(dir)
            .args(&args)
            .args(["--store", ".cairn/cairn.db"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(4), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let _ = run.kill();
    wait_exit(&mut run);
}

/// A stand-in for Claude Code: `-p` runs a task as stream-json lines (a
/// message and a tool result at a time); `--resume` with `-p` goes on in
/// the session; without `-p` it is the person's interactive session, which
/// keeps the line they type.
const FAKE_CLAUDE: &str = r#"#!/bin/sh
case " $* " in
  *" -p "*) ;;
  *) printf 'session %s> ' "$2"; IFS= read -r line; printf '%s\n' "$line" > person.txt; exit 0 ;;
esac
case " $* " in
  *" --resume sess-h1 "*)
    echo '{"type":"system","subtype":"init","session_id":"sess-h1","model":"claude-test"}'
    echo '{"type":"assistant","message":{"content":[{"type":"text","text":"Continuing after the person."}]}}'
    echo '{"type":"result","subtype":"success","result":"finished after handback","usage":{"input_tokens":5,"output_tokens":3}}'
    exit 0 ;;
esac
echo '{"type":"system","subtype":"init","session_id":"sess-h1","model":"claude-test"}'
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  echo "{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"working $i\"}]}}"
  sleep 0.3
  echo '{"type":"user","message":{"content":[{"type":"tool_result","content":"ok"}]}}'
done
echo '{"type":"result","subtype":"success","result":"finished alone","usage":{"input_tokens":5,"output_tokens":3}}'
"#;

#[test]
fn a_claude_code_session_is_handed_to_the_person_and_back() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cli = dir.join("fake-claude");
    std::fs::write(&cli, FAKE_CLAUDE).unwrap();
    std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join("cc.yaml"),
        format!(
            r#"name: cc
models:
  m: {{ provider: anthropic, model: claude-test }}
nodes:
  - id: coder
    agent:
      model: m
      engine: claude-code
      engine_command: ["{}"]
      prompt: Do it.
output: "{{{{ nodes.coder.output }}}}"
"#,
            cli.display()
        ),
    )
    .unwrap();
    let mut run = cairn_session(dir, &["run", "cc.yaml", "--run-id", "c1"]);
    wait_until("the CLI's first message", || {
        mirror(dir, "c1").contains("working 1")
    });
    let mut tty = Tty::spawn(dir, &["hijack", "c1", "coder"]);
    // The person is in the CLI's own session, on this terminal.
    tty.wait_shown("session sess-h1> ", 1);
    assert!(tty.text().contains("--resume sess-h1"), "{}", tty.text());
    tty.type_line("the person was here");
    tty.wait_shown("handed back", 1);
    assert_eq!(wait_exit(&mut tty.child).code(), Some(0));
    assert_eq!(wait_exit(&mut run).code(), Some(0), "{}", sessions_err(dir));
    assert_eq!(
        std::fs::read_to_string(dir.join("person.txt")).unwrap(),
        "the person was here\n"
    );
    let evs = events(dir, "c1");
    assert!(evs.iter().any(|e| matches!(&e.kind,
        EventKind::RunHijacked { engine, mode, resumed: true } if engine == "claude-code" && mode == "interactive")));
    // The CLI was stopped before its task's end, and went on in the same
    // session once handed back.
    assert!(!mirror(dir, "c1").contains("working 20"));
    assert!(evs.iter().any(|e| matches!(&e.kind,
        EventKind::RunFinished { output: Some(o), .. } if o == "finished after handback")));
}
