//! Durations and retry delays.

use std::time::Duration;

use cairn_workflow::{parse_duration, Backoff, RetryPolicy};

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
    assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
    for bad in ["", "s", "1.5s", "-1s", "10 minutes", "1d", "ms500", "1h30m"] {
        let e = parse_duration(bad).unwrap_err();
        assert!(e.contains("500ms, 30s, 10m, 1h"), "{bad}: {e}");
    }
    assert!(parse_duration("99999999999999999h").is_err());
}

fn policy(backoff: Backoff) -> RetryPolicy {
    RetryPolicy {
        attempts: 5,
        backoff,
        delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(5),
    }
}

#[test]
fn exponential_doubles_up_to_the_cap() {
    let p = policy(Backoff::Exponential);
    let full: Vec<Duration> = (2..=6).map(|a| p.delay_before(a, 1.0)).collect();
    assert_eq!(
        full,
        [1, 2, 4, 5, 5].map(Duration::from_secs),
        "no jitter reduction at 1.0"
    );
    // Huge attempt numbers saturate at the cap instead of overflowing.
    assert_eq!(p.delay_before(1000, 1.0), Duration::from_secs(5));
}

#[test]
fn fixed_stays_put() {
    let p = policy(Backoff::Fixed);
    for a in 2..=5 {
        assert_eq!(p.delay_before(a, 1.0), Duration::from_secs(1));
    }
}

#[test]
fn jitter_scales_between_half_and_full() {
    let p = policy(Backoff::Exponential);
    assert_eq!(p.delay_before(3, 0.0), Duration::from_secs(1));
    assert_eq!(p.delay_before(3, 0.5), Duration::from_millis(1500));
    assert_eq!(p.delay_before(3, 1.0), Duration::from_secs(2));
    // Out-of-range fractions are clamped, never beyond the policy's bounds.
    assert_eq!(p.delay_before(3, -3.0), Duration::from_secs(1));
    assert_eq!(p.delay_before(3, 7.0), Duration::from_secs(2));
    assert_eq!(p.delay_before(3, f64::NAN), Duration::from_secs(2));
}

#[test]
fn parsed_retry_defaults() {
    let wf = cairn_workflow::parse(
        "name: r\nnodes:\n  - id: a\n    value: 1\n    retry: { attempts: 2, delay: 2m }\n",
        std::path::Path::new("r.yaml"),
    )
    .unwrap();
    let r = wf.nodes[0].retry.as_ref().unwrap();
    assert_eq!(r.attempts, 2);
    assert_eq!(r.backoff, Backoff::Exponential);
    assert_eq!(r.delay, Duration::from_secs(120));
    // A delay longer than the default cap raises the cap with it.
    assert_eq!(r.max_delay, Duration::from_secs(120));
}
