//! Who holds a run's lock, read from the kernel's table of locks.

/// Every `flock` write lock of the kernel's table of locks (`/proc/locks`,
/// `1: FLOCK ADVISORY WRITE 4242 08:01:1234 0 EOF`): the holder's pid by
/// inode. The device is not compared: an overlay file system shows another
/// device there than `stat` does.
pub(crate) fn flock_holders(table: &str) -> std::collections::HashMap<u64, u32> {
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(1) != Some(&"FLOCK") || f.get(3) != Some(&"WRITE") {
                return None;
            }
            let ino: u64 = f.get(5)?.rsplit(':').next()?.parse().ok()?;
            Some((ino, f.get(4)?.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::flock_holders;

    #[test]
    fn the_holder_of_a_lock_is_read_from_the_kernels_table() {
        let table = "1: POSIX  ADVISORY  WRITE 77 08:01:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 5 00:2a:555 0 EOF\n";
        let all = flock_holders(table);
        assert_eq!(all.get(&1234), Some(&4242));
        assert_eq!(all.get(&99), None, "a POSIX lock is not a run's");
        assert_eq!(all.get(&555), None, "a read lock is not a run's");
        assert_eq!(all.len(), 1);
        assert!(flock_holders("").is_empty());
    }
}
