//! Where a store lives: the server and database a URL names, and the schema
//! that holds its tables.

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

use cairn_storage::StoreError;

/// The schema when none is chosen: PostgreSQL's own default.
pub(crate) const DEFAULT_SCHEMA: &str = "public";

/// How the store's sessions show in `pg_stat_activity` unless the URL says.
const DEFAULT_APPLICATION: &str = "cairn";

/// How long connecting may take unless the URL says: an unreachable server
/// should fail an open, not hang it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest identifier PostgreSQL keeps (NAMEDATALEN - 1); longer ones
/// are cut silently, which would make LISTEN and NOTIFY disagree.
const MAX_IDENTIFIER: usize = 63;

/// A parsed store location.
#[derive(Clone)]
pub(crate) struct Target {
    /// How the pool connects: every session's `search_path` is the schema.
    pub(crate) config: Config,
    /// How connections set up TLS, as the URL's `sslmode` says.
    pub(crate) tls: MakeRustlsConnect,
    /// The schema holding the tables, a plain lowercase identifier.
    pub(crate) schema: String,
    /// What errors name as the store (no password).
    pub(crate) place: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the config: it may hold a password.
        f.debug_struct("Target")
            .field("schema", &self.schema)
            .field("place", &self.place)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Reads a `postgres://` or `postgresql://` URL (or libpq's
    /// `key=value` form) and checks the schema name.
    pub(crate) fn parse(url: &str, schema: Option<&str>) -> Result<Target, StoreError> {
        // The URL may hold a password: no error repeats it.
        let unparsed = || "(the PostgreSQL URL)".to_string();
        let (url, tls) = crate::tls::split(url).map_err(|detail| StoreError::Open {
            store: unparsed(),
            detail,
        })?;
        let mut config = Config::from_str(&url).map_err(|e| StoreError::Open {
            store: unparsed(),
            detail: crate::db::describe(&e),
        })?;
        let schema = schema.unwrap_or(DEFAULT_SCHEMA).to_string();
        let place = place(&config, &schema);
        check_identifier(&schema).map_err(|detail| StoreError::Open {
            store: place.clone(),
            detail,
        })?;
        let (mode, tls) = tls.connector().map_err(|detail| StoreError::Open {
            store: place.clone(),
            detail,
        })?;
        config.ssl_mode(mode);
        let options = match config.get_options() {
            Some(o) if !o.trim().is_empty() => format!("{o} -c search_path={schema}"),
            _ => format!("-c search_path={schema}"),
        };
        config.options(options);
        if config.get_application_name().is_none() {
            config.application_name(DEFAULT_APPLICATION);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        Ok(Target {
            config,
            tls,
            schema,
            place,
        })
    }

    /// How the wake-up connection connects: as the pool does, under a name
    /// of its own so that it can be told apart in `pg_stat_activity`.
    pub(crate) fn wake_config(&self) -> Config {
        let mut config = self.config.clone();
        let app = config
            .get_application_name()
            .unwrap_or(DEFAULT_APPLICATION)
            .to_string();
        config.application_name(format!("{app}-wake"));
        config
    }

    /// The LISTEN/NOTIFY channel of this store: one per schema, so that
    /// stores sharing a database do not wake each other.
    pub(crate) fn channel(&self) -> String {
        let name = format!("cairn_wake_{}", self.schema);
        if name.len() <= MAX_IDENTIFIER {
            return name;
        }
        // Keep it unique within the limit: a prefix plus a stable hash (the
        // same in every process and every build).
        let hash = fnv1a(self.schema.as_bytes());
        format!("cairn_wake_{}_{hash:016x}", &self.schema[..35])
    }
}

/// The store's place as errors show it: user, server, database and schema.
fn place(config: &Config, schema: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = config.get_dbname().unwrap_or("");
    format!("postgres://{user}{host}:{port}/{db} (schema {schema})")
}

/// Accepts `[a-z_][a-z0-9_]{0,62}`: a name that needs no quoting anywhere
/// (SQL, the `search_path` option, channel names) and is never cut short.
pub(crate) fn check_identifier(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && name.len() <= MAX_IDENTIFIER {
        Ok(())
    } else {
        Err(format!(
            "invalid schema name `{name}`: use 1-63 lowercase letters, digits and `_`, not starting with a digit"
        ))
    }
}

/// `name` as a quoted SQL identifier. Only for names that passed
/// [`check_identifier`]: quoting keeps keywords (`user`, `order`) usable.
pub(crate) fn quote(name: &str) -> String {
    debug_assert!(check_identifier(name).is_ok());
    format!("\"{name}\"")
}

/// 64-bit FNV-1a: a hash that every Cairn computes alike, for names and
/// lock keys shared across processes (std's hasher may change per build).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        for ok in ["public", "_x", "cairn_t_12_3_abc", &"a".repeat(63)] {
            assert!(check_identifier(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1x",
            "Public",
            "a-b",
            "a b",
            "a\"b",
            "ü",
            &"a".repeat(64),
        ] {
            assert!(check_identifier(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_of_both_schemes_are_read_and_passwords_kept_out_of_the_place() {
        for url in [
            "postgres://ann:secret@db.example:6543/cairn",
            "postgresql://ann:secret@db.example:6543/cairn",
        ] {
            let t = Target::parse(url, Some("runs")).unwrap();
            let place = t.place.clone();
            assert_eq!(place, "postgres://ann@db.example:6543/cairn (schema runs)");
            assert_eq!(t.config.get_options(), Some("-c search_path=runs"));
            assert_eq!(t.config.get_application_name(), Some("cairn"));
        }
        let t = Target::parse("postgres://h/d?options=-c%20work_mem%3D8MB", None).unwrap();
        assert_eq!(
            t.config.get_options(),
            Some("-c work_mem=8MB -c search_path=public")
        );
        let err = Target::parse("postgres://ann:secret@h:notaport/d", None).unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        let err = Target::parse("postgres://h/d", Some("Bad-Name")).unwrap_err();
        assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    }

    #[test]
    fn channels_fit_an_identifier_and_stay_apart() {
        let t = |s: &str| Target::parse("postgres://h/d", Some(s)).unwrap().channel();
        assert_eq!(t("public"), "cairn_wake_public");
        let long_a = format!("{}a", "x".repeat(62));
        let long_b = format!("{}b", "x".repeat(62));
        assert!(t(&long_a).len() <= MAX_IDENTIFIER);
        assert_ne!(t(&long_a), t(&long_b));
    }
}
