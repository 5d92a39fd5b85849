//! Who holds a run's lock, read from the kernel's table of locks.

/// The pid holding a `flock` on the file with inode `inode`, from the
/// text of `/proc/locks` (`1: FLOCK ADVISORY WRITE 4242 08:01:1234 0 EOF`).
/// The device is not compared: an overlay file system shows another
/// device there than `stat` does.
pub(crate) fn flock_holder(table: &str, inode: u64) -> Option<u32> {
    table.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // A lock someone waits for is listed after `->`.
        if f.get(1) != Some(&"FLOCK") || f.get(3) != Some(&"WRITE") {
            return None;
        }
        let ino: u64 = f.get(5)?.rsplit(':').next()?.parse().ok()?;
        (ino == inode).then(|| f.get(4)?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::flock_holder;

    #[test]
    fn the_holder_of_a_lock_is_read_from_the_kernels_table() {
        let table = "1: POSIX  ADVISORY  WRITE 77 08:01:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 5 00:2a:555 0 EOF\n";
        assert_eq!(flock_holder(table, 1234), Some(4242));
        assert_eq!(flock_holder(table, 99), None);
        assert_eq!(flock_holder(table, 555), None);
        assert_eq!(flock_holder("", 1234), None);
    }
}
