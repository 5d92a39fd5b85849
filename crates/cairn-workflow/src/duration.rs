use std::time::Duration;

/// Parses a duration: an integer followed by `ms`, `s`, `m` or `h` (`500ms`, `30s`, `10m`,
/// `1h`). A bare integer means seconds, since YAML authors often write `timeout: 30`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad =
        || format!("`{s}` is not a duration (write an integer and a unit: 500ms, 30s, 10m, 1h)");
    if num.is_empty() {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let ms_per = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{s}` is too long a duration"))
}
