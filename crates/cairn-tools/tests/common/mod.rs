//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_tools::{NetworkAction, ProcessObserver, Stream, ToolObserver};

/// Records everything an observer hears.
#[derive(Default)]
pub struct Recorder {
    pub pids: Mutex<Vec<u32>>,
    pub stdout: Mutex<String>,
    pub stderr: Mutex<String>,
    pub chunks: Mutex<usize>,
    pub network: Mutex<Vec<(NetworkAction, String, String)>>,
    /// What `ProcessObserver::network_refused` heard (the runner alone).
    pub refused: Mutex<Vec<(String, String)>>,
}

impl ProcessObserver for Recorder {
    fn spawned(&self, pid: u32) {
        self.pids.lock().unwrap().push(pid);
    }
    fn output(&self, stream: Stream, text: &str) {
        *self.chunks.lock().unwrap() += 1;
        match stream {
            Stream::Stdout => self.stdout.lock().unwrap().push_str(text),
            Stream::Stderr => self.stderr.lock().unwrap().push_str(text),
        }
    }
    fn network_refused(&self, target: &str, reason: &str) {
        self.refused
            .lock()
            .unwrap()
            .push((target.to_string(), reason.to_string()));
    }
}

impl ToolObserver for Recorder {
    fn network(&self, action: NetworkAction, target: &str, reason: &str) {
        self.network
            .lock()
            .unwrap()
            .push((action, target.to_string(), reason.to_string()));
    }
}

/// Whether a pid names a live (non-zombie) process.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // State is the field after the parenthesised command name.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
    }
}

/// Waits (bounded) until none of `pids` is alive; returns the survivors.
/// SIGKILL is delivered asynchronously, so a few milliseconds may pass.
pub fn wait_all_dead(pids: &[i32]) -> Vec<i32> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let live: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if live.is_empty() || Instant::now() > until {
            return live;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `/proc/self/status` field in kB.
pub fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{field} missing from /proc/self/status"))
}

pub fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Host pids of processes whose argv contains `marker` as one argument.
/// Sandboxed processes print pids of their own PID namespace, so tests find
/// them from outside by a marker instead.
pub fn pids_with_arg(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if cmdline.split(|b| *b == 0).any(|a| a == marker.as_bytes()) && alive(pid) {
                found.push(pid);
            }
        }
    }
    found
}

/// Waits (bounded) until no live process has `marker` in its argv; returns
/// the survivors.
pub fn wait_none_with_arg(marker: &str) -> Vec<i32> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let live = pids_with_arg(marker);
        if live.is_empty() || Instant::now() > until {
            return live;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
