//! The allocators of a process that drives runs.
//!
//! Rust's allocations go to jemalloc ([`use_run_allocator!`]): with glibc's
//! malloc, a run's per-node cost grew with its size, because freed blocks of
//! all sizes pile up in its bins and every allocation of a large run walked
//! and merged more of them (at 100,000 nodes, glibc's chunk bookkeeping
//! was the largest single cost of the engine's threads, and a node cost
//! 1.6 to 2 times what it cost at 1,000). jemalloc keeps blocks of one size
//! class together, and the engine bench's per-node cost stays flat.
//!
//! jemalloc gets one arena (`narenas:1`, [`MALLOC_CONF`]) rather than four
//! per core: a run allocates on the runtime's workers, the blocking pool and
//! the store's writer, each through a cache of its own, and every arena keeps
//! freed pages for a while, so more arenas only raise resident memory. One
//! arena rather than two: `cairn run` of a 100,000-node chain of value nodes
//! peaked 1–2 MB lower (142.6–143.5 MB against 144.7, two runs each, same
//! binary), its fan-out the same (131.7–132.3 against 131.4–132.9), in
//! the same wall time within the machine's noise. The C
//! code in the process (SQLite) still allocates with glibc's malloc,
//! limited to [`MALLOC_ARENAS`] ([`limit_malloc_arenas`]).

/// Most glibc malloc arenas a process that drives runs keeps.
pub const MALLOC_ARENAS: i32 = 2;

/// jemalloc's settings for a process that drives runs (the `malloc_conf`
/// string; `_RJEM_MALLOC_CONF` in the environment still overrides it).
pub const MALLOC_CONF: &[u8] = b"narenas:1\0";

/// The global allocator of a process that drives runs: jemalloc.
pub use tikv_jemallocator::Jemalloc as RunAllocator;

/// Makes jemalloc, with Cairn's settings, the global allocator of the
/// binary that invokes it (at the crate root, once): `cairn` and the
/// engine's benches do, so that what is measured is what runs.
#[macro_export]
macro_rules! use_run_allocator {
    () => {
        #[global_allocator]
        static CAIRN_RUN_ALLOCATOR: $crate::RunAllocator = $crate::RunAllocator;

        /// jemalloc reads its settings from this symbol when it starts.
        #[allow(non_upper_case_globals)]
        #[export_name = "_rjem_malloc_conf"]
        #[used]
        static cairn_malloc_conf: $crate::MallocConf = $crate::MallocConf::DEFAULT;
    };
}

/// A C string jemalloc reads at start: `const char *malloc_conf`.
#[repr(transparent)]
pub struct MallocConf(*const u8);

// SAFETY: it points at a static, immutable, NUL-terminated byte string.
unsafe impl Sync for MallocConf {}

impl MallocConf {
    /// [`MALLOC_CONF`] as jemalloc reads it.
    pub const DEFAULT: MallocConf = MallocConf(MALLOC_CONF.as_ptr());
}

/// Caps the number of glibc malloc arenas at [`MALLOC_ARENAS`]. Call it
/// first in `main`, before any thread starts: arenas already made stay. A
/// no-op where the C library is not glibc.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tuning; M_ARENA_MAX
    // takes effect for arenas made after the call.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Gives the memory freed so far back to the system (a large workflow's
/// parse leaves its YAML tree freed but resident): jemalloc's free pages of
/// every arena, and glibc's.
pub fn release_free_memory() {
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena at once.
    let name = b"arena.4096.purge\0";
    // SAFETY: a documented mallctl name that takes and returns nothing.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages; it touches no live block.
    unsafe {
        libc::malloc_trim(0);
    }
}
