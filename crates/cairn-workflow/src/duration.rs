use std::time::Duration;

/// Parses `500ms`, `30s`, `10m`, `1h`; a bare integer means seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let _ = s;
    todo!()
}
