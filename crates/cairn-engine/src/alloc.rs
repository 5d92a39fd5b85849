//! The C allocator's settings for a process that drives runs.
//!
//! glibc's malloc gives every thread that allocates under contention an arena
//! of its own and keeps what was freed in it. A run allocates on the
//! runtime's workers, the blocking pool and the store's writer, so a large
//! run's resident memory ends up well above what its heap holds (about
//! 110 MB above at 100,000 nodes in the engine bench). Two arenas keep the
//! runtime's two workers apart and the rest sharing.

/// Most malloc arenas a process that drives runs keeps.
pub const MALLOC_ARENAS: i32 = 2;

/// Caps the number of malloc arenas at [`MALLOC_ARENAS`]. Call it first in
/// `main`, before any thread starts: arenas already made stay. A no-op where
/// the C library is not glibc.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tuning; M_ARENA_MAX
    // takes effect for arenas made after the call.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Gives the memory freed so far back to the system (a large workflow's
/// parse leaves its YAML tree freed but resident). A no-op where the C
/// library is not glibc.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages; it touches no live block.
    unsafe {
        libc::malloc_trim(0);
    }
}
