//! The NDJSON mirror: `<log_dir>/<run>/events.ndjson`, one line per
//! committed event, byte for byte the store's JSON, in seq order.
//!
//! The store is the truth and the mirror follows it. A write can fail part-way
//! (a full disk) and leave a torn last line, and a process can die between a
//! commit and its mirror write. So a mirror is only appended to while this
//! writer knows it ends exactly at the seq before the batch; otherwise (a
//! failed write, or a file this writer has not opened yet, as on a resume) it
//! is first repaired: cut back to its last complete line that matches the
//! store, then filled from the store up to the batch.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_events::RunId;
use cairn_storage::prelude::*;
use cairn_storage::{EventQuery, StoredEvent};

/// Events read from the store at a time while filling a mirror: few at
/// first, since on a disk that is still full the first write fails and
/// whatever was read in vain is wasted on every batch, then more.
const FILL_FIRST_PAGE: usize = 100;
/// The most events read at a time while filling a mirror.
const FILL_PAGE: usize = 10_000;
/// Bytes read at a time while looking for the last line of a mirror.
const TAIL_CHUNK: u64 = 64 * 1024;

/// Turns an opened mirror file into what the writer appends to; tests use it
/// to make writes fail part-way.
pub(crate) type WrapWriter = Arc<dyn Fn(File) -> Box<dyn Write + Send> + Send + Sync>;

/// One run's mirror as the writer knows it.
struct Mirror {
    /// The file, while it is known to end at `written` on a line boundary;
    /// `None` before the first write and after a failed one.
    out: Option<Box<dyn Write + Send>>,
    /// The seq of the file's last line while `out` is set.
    written: u64,
    /// The last seq handed to the mirror: what it must reach.
    wanted: u64,
    /// A failure was reported and nothing has been repaired since, so the
    /// next one stays quiet.
    warned: bool,
}

/// The mirrors of the runs this writer has written since they were last
/// closed.
pub(crate) struct Mirrors {
    dir: PathBuf,
    wrap: Option<WrapWriter>,
    files: HashMap<RunId, Mirror>,
}

impl Mirrors {
    pub(crate) fn new(dir: PathBuf, wrap: Option<WrapWriter>) -> Self {
        Mirrors {
            dir,
            wrap,
            files: HashMap::new(),
        }
    }

    fn path(&self, run: &RunId) -> PathBuf {
        self.dir.join(run.as_str()).join("events.ndjson")
    }

    /// Appends the lines of a committed batch (`first..=last` of `run`,
    /// already in the store), repairing the file first when this writer does
    /// not know it to end right before `first`.
    pub(crate) fn append(
        &mut self,
        backend: &dyn Backend,
        run: &RunId,
        first: u64,
        last: u64,
        text: &[u8],
    ) {
        let path = self.path(run);
        let wrap = self.wrap.clone();
        let m = self.files.entry(run.clone()).or_insert(Mirror {
            out: None,
            written: 0,
            wanted: 0,
            warned: false,
        });
        m.wanted = m.wanted.max(last);
        if m.out.is_none() || m.written + 1 != first {
            m.out = None;
            match repair(backend, run, &path, first - 1).and_then(|_| open_append(&path)) {
                Ok(f) => {
                    m.out = Some(match &wrap {
                        Some(w) => w(f),
                        None => Box::new(f),
                    });
                    m.written = first - 1;
                }
                Err(e) => return report(m, run, &path, &e),
            }
        }
        let out = m.out.as_mut().expect("opened above");
        match out.write_all(text).and_then(|_| out.flush()) {
            Ok(()) => {
                m.written = last;
                m.warned = false;
            }
            Err(e) => {
                // Part of `text` may be in the file: it is repaired before
                // anything else goes in.
                m.out = None;
                report(m, run, &path, &e);
            }
        }
    }

    /// Forgets a run's mirror (its `RunLog` went, or it ended). A mirror left
    /// torn by a failed write gets one more repair first, so a run that ends
    /// right after a failure still leaves a whole file.
    pub(crate) fn close(&mut self, backend: &dyn Backend, run: &RunId) {
        let Some(mut m) = self.files.remove(run) else {
            return;
        };
        if m.out.is_none() && m.wanted > 0 {
            let path = self.path(run);
            match repair(backend, run, &path, m.wanted) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "repaired the NDJSON mirror from the store")
                }
                Err(e) => report(&mut m, run, &path, &e),
            }
        }
    }

    /// Closes every mirror, as the writer stops.
    pub(crate) fn close_all(&mut self, backend: &dyn Backend) {
        let runs: Vec<RunId> = self.files.keys().cloned().collect();
        for run in runs {
            self.close(backend, &run);
        }
    }
}

fn report(m: &mut Mirror, run: &str, path: &Path, e: &io::Error) {
    if !m.warned {
        tracing::warn!(run = %run, path = %path.display(), error = %e,
            "writing the NDJSON mirror failed; the store has every event and the mirror is \
             repaired from it on the run's next write");
        m.warned = true;
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().append(true).open(path)
}

fn store_err(e: crate::StoreError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Makes the mirror at `path` hold exactly the store's events `1..=upto` of
/// `run`: keeps its longest prefix of whole lines that ends in the store's
/// line for that seq, cuts the rest (a torn line, or lines the store does not
/// have) and writes the missing lines from the store.
pub(crate) fn repair(backend: &dyn Backend, run: &RunId, path: &Path, upto: u64) -> io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let (keep, kept) = sound_prefix(&mut f, backend, run, upto)?;
    if f.metadata()?.len() != keep {
        f.set_len(keep)?;
    }
    f.seek(SeekFrom::Start(keep))?;
    let mut out = BufWriter::new(f);
    let mut after = kept;
    let mut page_len = FILL_FIRST_PAGE;
    while after < upto {
        let q = EventQuery {
            after,
            limit: Some(page_len.min((upto - after) as usize)),
            ..Default::default()
        };
        page_len = (page_len * 10).min(FILL_PAGE);
        let page = backend.read_events(run, &q).map_err(store_err)?;
        let Some(last) = page.last() else {
            break;
        };
        after = last.seq;
        for ev in &page {
            out.write_all(ev.json.as_bytes())?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()
}

/// How many leading bytes of the mirror to keep, and the seq of the last line
/// kept. The file's earlier lines are trusted; its last whole line must be
/// the store's line for its seq, at most `upto`. Anything else (garbage, a
/// line of another run or of a run deleted and started again under the same
/// id) means rewriting the whole file.
fn sound_prefix(
    f: &mut File,
    backend: &dyn Backend,
    run: &RunId,
    upto: u64,
) -> io::Result<(u64, u64)> {
    let len = f.metadata()?.len();
    let Some(end) = rfind_newline(f, len)? else {
        return Ok((0, 0));
    };
    let start = match rfind_newline(f, end)? {
        Some(p) => p + 1,
        None => 0,
    };
    let mut line = vec![0u8; (end - start) as usize];
    f.seek(SeekFrom::Start(start))?;
    f.read_exact(&mut line)?;
    let seq = serde_json::from_slice::<serde_json::Value>(&line)
        .ok()
        .and_then(|v| v.get("seq").and_then(|s| s.as_u64()));
    let Some(seq) = seq.filter(|s| (1..=upto).contains(s)) else {
        return Ok((0, 0));
    };
    let q = EventQuery {
        after: seq - 1,
        limit: Some(1),
        ..Default::default()
    };
    let stored: Vec<StoredEvent> = backend.read_events(run, &q).map_err(store_err)?;
    match stored.first() {
        Some(ev) if ev.seq == seq && ev.json.as_bytes() == line.as_slice() => Ok((end + 1, seq)),
        _ => Ok((0, 0)),
    }
}

/// The position of the last `\n` before `before`, reading backwards.
fn rfind_newline(f: &mut File, before: u64) -> io::Result<Option<u64>> {
    let mut hi = before;
    let mut buf = vec![0u8; TAIL_CHUNK as usize];
    while hi > 0 {
        let lo = hi.saturating_sub(TAIL_CHUNK);
        let chunk = &mut buf[..(hi - lo) as usize];
        f.seek(SeekFrom::Start(lo))?;
        f.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(lo + i as u64));
        }
        hi = lo;
    }
    Ok(None)
}
