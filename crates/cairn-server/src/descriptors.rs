//! File descriptors, the resource a busy server runs out of first: each
//! active run holds a few (its lock, its log mirror, a wake-up socket, a
//! provider connection), and every connection to the server one more.
//!
//! At start the soft limit is raised to the hard one ([`raise_limit`]), and
//! a new run is accepted only while a reserve stays free ([`check_reserve`]),
//! so that the runs already going (and the requests that read them) do not
//! meet `EMFILE` because of one more start: a start refused for want of
//! descriptors is a `503` with `Retry-After`, never a failure of its own.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ApiError;

/// The soft and hard `RLIMIT_NOFILE` of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The soft limit before [`raise_limit`].
    pub before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit (the most the soft one may be raised to).
    pub hard: u64,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |n: u64| {
            if n == libc::RLIM_INFINITY {
                "unlimited".to_string()
            } else {
                n.to_string()
            }
        };
        if self.before == self.soft {
            write!(
                f,
                "file descriptors: {} (the hard limit is {})",
                shown(self.soft),
                shown(self.hard)
            )
        } else {
            write!(
                f,
                "file descriptors: {} (raised from {} to the hard limit)",
                shown(self.soft),
                shown(self.before)
            )
        }
    }
}

fn get() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into a live struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (the default soft
/// limit, often 1,024, holds a few hundred runs at most). Programs the
/// engine starts inherit the raised limit.
pub fn raise_limit() -> io::Result<Limit> {
    let mut lim = get()?;
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads a live struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(Limit {
        before,
        soft: lim.rlim_cur,
        hard: lim.rlim_max,
    })
}

/// Descriptors kept free for the runs already going when a new one asks to
/// start: a tenth of the limit, at least 64, at most 1,024.
pub(crate) fn reserve(limit: u64) -> u64 {
    (limit / 10).clamp(64, 1024)
}

/// How many descriptors this process has open (`/proc/self/fd`, less the
/// one that reads it).
fn open_count() -> io::Result<u64> {
    let n = std::fs::read_dir("/proc/self/fd")?.count() as u64;
    Ok(n.saturating_sub(1))
}

/// Descriptors a start is counted for until it has opened its own (its
/// lock, its log, its wake-up socket, the workflow file, a spare), so that
/// many starts at once do not all pass the check before any of them shows
/// in `/proc`.
const PER_START: u64 = 6;

/// Starts admitted that have not yet opened their descriptors.
static STARTING: AtomicU64 = AtomicU64::new(0);

/// A start admitted by [`admit`]: counted as [`PER_START`] descriptors
/// until dropped (once the run has started, or failed to).
pub(crate) struct Admitted(());

impl Drop for Admitted {
    fn drop(&mut self) {
        STARTING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Admits a new run, or refuses it (`503 out_of_descriptors`,
/// `Retry-After`) when fewer than [`reserve`] descriptors would stay free
/// with it and the other starts under way. Where `/proc` cannot tell, the
/// run is let through (its own errors still say what ran out); when
/// counting itself fails for want of a descriptor, that is the answer.
pub(crate) fn admit() -> Result<Admitted, ApiError> {
    let starting = STARTING.fetch_add(1, Ordering::SeqCst) + 1;
    let admitted = Admitted(());
    check_reserve(starting * PER_START)?;
    Ok(admitted)
}

fn check_reserve(pending: u64) -> Result<(), ApiError> {
    let Ok(lim) = get() else {
        return Ok(());
    };
    if lim.rlim_cur == libc::RLIM_INFINITY {
        return Ok(());
    }
    let open = match open_count() {
        Ok(n) => n,
        Err(e) if crate::error::io_out_of_descriptors(&e) => {
            return Err(ApiError::out_of_descriptors(e));
        }
        Err(_) => return Ok(()),
    };
    let free = lim.rlim_cur.saturating_sub(open).saturating_sub(pending);
    let keep = reserve(lim.rlim_cur);
    if free < keep {
        return Err(ApiError::out_of_descriptors(format_args!(
            "{open} of {} open, {pending} more for starts under way, {keep} kept free for the runs going",
            lim.rlim_cur
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_a_tenth_within_bounds() {
        assert_eq!(reserve(256), 64);
        assert_eq!(reserve(1024), 102);
        assert_eq!(reserve(1 << 20), 1024);
    }

    #[test]
    fn raising_reaches_the_hard_limit_and_is_said() {
        let l = raise_limit().unwrap();
        assert_eq!(l.soft, l.hard);
        assert!(l.to_string().starts_with("file descriptors: "), "{l}");
        // What /proc counts is what is open: one more file, one more.
        let a = open_count().unwrap();
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let b = open_count().unwrap();
        drop(f);
        assert!(b > a, "{a} then {b}");
    }
}
