//! The bridge's flags, checked together before anything starts.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::envelope::FleetKey;
use crate::replay::DEFAULT_WINDOW_MS;

/// A fleet key shorter than this is refused: 32 bytes is HMAC-SHA256's own strength.
pub const MIN_FLEET_KEY_BYTES: usize = 32;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "llm-bridge",
    version,
    about = "Shares one Envoy replica's routing state with its peers over NATS"
)]
// A flag given twice takes its last value (as a supervisor appending overrides expects).
#[command(args_override_self = true)]
#[command(group = clap::ArgGroup::new("auth").required(true).args(["token", "token_file"]))]
// The bus admits only the fleet: a key, or the operator's explicit word that there is none.
#[command(group = clap::ArgGroup::new("fleet").required(true).args(["fleet_key_file", "insecure_no_fleet_key"]))]
// One way to authenticate to NATS at a time.
#[command(group = clap::ArgGroup::new("nats_auth").multiple(false).args(["nats_creds", "nats_nkey_file", "nats_token_file", "nats_user"]))]
pub struct Args {
    /// The filter's replicas endpoint on this replica's loopback listener, e.g.
    /// http://127.0.0.1:9901/llm-router/replicas.
    #[arg(long)]
    pub envoy_url: String,
    /// Bearer token the filter expects (its `stats_token`; prefer --token-file).
    #[arg(long)]
    pub token: Option<String>,
    /// File holding the bearer token (surrounding whitespace is ignored).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// NATS server URL(s), comma-separated (`tls://` requires TLS).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// NATS credentials file (a user JWT and its nkey seed, as `nsc` writes it).
    #[arg(long)]
    pub nats_creds: Option<PathBuf>,
    /// File holding an nkey seed (`SU...`) the NATS server knows the public key of.
    #[arg(long)]
    pub nats_nkey_file: Option<PathBuf>,
    /// File holding the NATS server's authorization token.
    #[arg(long)]
    pub nats_token_file: Option<PathBuf>,
    /// NATS user name (with --nats-password-file).
    #[arg(long, requires = "nats_password_file")]
    pub nats_user: Option<String>,
    /// File holding the NATS user's password.
    #[arg(long, requires = "nats_user")]
    pub nats_password_file: Option<PathBuf>,
    /// CA certificate(s) (PEM) that sign the NATS server's certificate; requires TLS.
    #[arg(long)]
    pub nats_ca: Option<PathBuf>,
    /// Client certificate (PEM) for NATS servers that verify clients (with --nats-key).
    #[arg(long, requires = "nats_key")]
    pub nats_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "nats_cert")]
    pub nats_key: Option<PathBuf>,
    /// File holding the fleet key (at least 32 bytes; surrounding whitespace is
    /// ignored), the same on every bridge of the fleet: every message is
    /// authenticated with it, and messages without it are refused.
    #[arg(long)]
    pub fleet_key_file: Option<PathBuf>,
    /// Run without a fleet key: anyone who can publish on the bus can change every
    /// replica's routing. For a bus nobody else can reach.
    #[arg(long)]
    pub insecure_no_fleet_key: bool,
    /// A message sent longer ago than this (or this far ahead of this clock) is
    /// refused: the bound on replays, and on the clock skew the fleet may have.
    #[arg(long, default_value_t = DEFAULT_WINDOW_MS)]
    pub max_message_age_ms: u64,
    /// This replica's id, unique in the fleet (A-Z a-z 0-9 - _ .).
    #[arg(long)]
    pub replica: String,
    /// Subject prefix, so several fleets can share one bus.
    #[arg(long, default_value = "llm-router")]
    pub subject_prefix: String,
    /// How often the filter is asked for new operations.
    #[arg(long, default_value_t = 50)]
    pub poll_ms: u64,
    /// How often the in-flight counts are published when no operation is.
    #[arg(long, default_value_t = 250)]
    pub load_ms: u64,
    /// Bytes of own batches kept for peers' catch-up.
    #[arg(long, default_value_t = 8 << 20)]
    pub retain_bytes: usize,
    /// How long a catch-up waits for peers' answers.
    #[arg(long, default_value_t = 1000)]
    pub catchup_ms: u64,
    /// Serve /metrics (Prometheus text) and /healthz here.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
}

/// How the bridge proves itself to NATS.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsAuth {
    None,
    /// A credentials file's contents.
    Creds(String),
    Nkey(String),
    Token(String),
    UserPassword(String, String),
}

impl std::fmt::Debug for NatsAuth {
    /// Names the method, never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NatsAuth::None => "None",
            NatsAuth::Creds(_) => "Creds",
            NatsAuth::Nkey(_) => "Nkey",
            NatsAuth::Token(_) => "Token",
            NatsAuth::UserPassword(..) => "UserPassword",
        })
    }
}

/// TLS to NATS beyond what the URL asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTls {
    pub ca: Option<PathBuf>,
    /// Client certificate and key.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// The flags, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub envoy_url: String,
    pub token: String,
    pub nats: String,
    pub nats_auth: NatsAuth,
    pub nats_tls: NatsTls,
    /// Empty only with --insecure-no-fleet-key.
    pub fleet_key: FleetKey,
    pub max_message_age_ms: u64,
    pub replica: String,
    pub prefix: String,
    pub poll: Duration,
    pub load: Duration,
    pub retain_bytes: usize,
    pub catchup: Duration,
    pub listen: Option<SocketAddr>,
}

/// A secret file's contents, trimmed, refused when empty.
fn read_secret(flag: &str, path: &PathBuf) -> anyhow::Result<String> {
    let s = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))?
        .trim()
        .to_string();
    anyhow::ensure!(
        !s.is_empty(),
        "{flag} {}: the file is empty",
        path.display()
    );
    Ok(s)
}

fn readable(flag: &str, path: &PathBuf) -> anyhow::Result<PathBuf> {
    std::fs::metadata(path).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))?;
    Ok(path.clone())
}

impl Args {
    fn nats_auth(&self) -> anyhow::Result<NatsAuth> {
        Ok(match self {
            Args {
                nats_creds: Some(p),
                ..
            } => NatsAuth::Creds(read_secret("--nats-creds", p)?),
            Args {
                nats_nkey_file: Some(p),
                ..
            } => NatsAuth::Nkey(read_secret("--nats-nkey-file", p)?),
            Args {
                nats_token_file: Some(p),
                ..
            } => NatsAuth::Token(read_secret("--nats-token-file", p)?),
            Args {
                nats_user: Some(u),
                nats_password_file: Some(p),
                ..
            } => {
                anyhow::ensure!(!u.is_empty(), "--nats-user is empty");
                NatsAuth::UserPassword(u.clone(), read_secret("--nats-password-file", p)?)
            }
            _ => NatsAuth::None,
        })
    }

    fn fleet_key(&self) -> anyhow::Result<FleetKey> {
        let key = match &self.fleet_key_file {
            Some(p) => {
                let key = read_secret("--fleet-key-file", p)?;
                anyhow::ensure!(
                    key.len() >= MIN_FLEET_KEY_BYTES,
                    "--fleet-key-file {}: {} bytes; the fleet key needs at least {MIN_FLEET_KEY_BYTES} \
                     (e.g. `openssl rand -base64 32 > fleet.key`, the same file on every bridge)",
                    p.display(),
                    key.len()
                );
                key.into_bytes()
            }
            None => Vec::new(),
        };
        Ok(FleetKey::new(key, &self.subject_prefix))
    }

    pub fn settings(&self) -> anyhow::Result<Settings> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.trim().to_string(),
            (None, Some(p)) => std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", p.display()))?
                .trim()
                .to_string(),
            (None, None) => String::new(),
        };
        anyhow::ensure!(
            !token.is_empty(),
            "the token is empty (--token or --token-file)"
        );
        anyhow::ensure!(
            !self.replica.is_empty()
                && self.replica.len() <= 128
                && self
                    .replica
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
            "--replica `{}`: 1 to 128 of A-Z a-z 0-9 - _ .",
            self.replica
        );
        anyhow::ensure!(
            !self.subject_prefix.is_empty() && !self.subject_prefix.contains([' ', '*', '>']),
            "--subject-prefix must be a NATS subject without wildcards"
        );
        let url: hyper::Uri = self
            .envoy_url
            .parse()
            .map_err(|e| anyhow::anyhow!("--envoy-url `{}`: {e}", self.envoy_url))?;
        anyhow::ensure!(
            url.scheme_str() == Some("http") && url.query().is_none(),
            "--envoy-url must be http:// (the loopback listener) and have no query"
        );
        anyhow::ensure!(
            self.poll_ms >= 1 && self.load_ms >= 1,
            "--poll-ms and --load-ms must be >= 1"
        );
        anyhow::ensure!(
            self.max_message_age_ms >= 1000,
            "--max-message-age-ms must be >= 1000 (transit and clock skew must fit in it)"
        );
        let nats_tls = NatsTls {
            ca: self
                .nats_ca
                .as_ref()
                .map(|p| readable("--nats-ca", p))
                .transpose()?,
            client: match (&self.nats_cert, &self.nats_key) {
                (Some(c), Some(k)) => {
                    Some((readable("--nats-cert", c)?, readable("--nats-key", k)?))
                }
                _ => None,
            },
        };
        Ok(Settings {
            envoy_url: self.envoy_url.clone(),
            token,
            nats: self.nats.clone(),
            nats_auth: self.nats_auth()?,
            nats_tls,
            fleet_key: self.fleet_key()?,
            max_message_age_ms: self.max_message_age_ms,
            replica: self.replica.clone(),
            prefix: self.subject_prefix.clone(),
            poll: Duration::from_millis(self.poll_ms),
            load: Duration::from_millis(self.load_ms),
            retain_bytes: self.retain_bytes,
            catchup: Duration::from_millis(self.catchup_ms),
            listen: self.listen,
        })
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A bridge's settings from its required flags and `extra`, without a fleet key
    /// unless `extra` gives one.
    pub fn parse(extra: &[&str]) -> anyhow::Result<Settings> {
        let mut argv = vec![
            "llm-bridge",
            "--envoy-url",
            "http://127.0.0.1:1/r",
            "--token",
            "t",
            "--replica",
            "a",
        ];
        argv.extend_from_slice(extra);
        if !extra.contains(&"--fleet-key-file") {
            argv.push("--insecure-no-fleet-key");
        }
        Args::try_parse_from(argv)?.settings()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::parse;
    use super::*;

    /// A file holding `text`, removed when the test ends.
    struct Secret(PathBuf);

    impl Secret {
        fn new(name: &str, text: &str) -> Secret {
            let p = std::env::temp_dir().join(format!("llm-bridge-{}-{name}", std::process::id()));
            std::fs::write(&p, text).unwrap();
            Secret(p)
        }
        fn path(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for Secret {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn err(extra: &[&str]) -> String {
        format!("{:#}", parse(extra).unwrap_err())
    }

    #[test]
    fn the_fleet_key_is_required_unless_refused_in_so_many_words() {
        let argv = [
            "llm-bridge",
            "--envoy-url",
            "http://127.0.0.1:1/r",
            "--token",
            "t",
            "--replica",
            "a",
        ];
        let e = Args::try_parse_from(argv).unwrap_err().to_string();
        assert!(
            e.contains("--fleet-key-file") && e.contains("--insecure-no-fleet-key"),
            "the error names both ways: {e}"
        );
        let good = Secret::new("good", &format!("{}\n", "k".repeat(32)));
        let s = parse(&["--fleet-key-file", good.path()]).unwrap();
        assert!(
            format!("{:?}", s.fleet_key).contains("32 bytes"),
            "whitespace is not key"
        );
        let short = Secret::new("short", &"k".repeat(31));
        assert!(err(&["--fleet-key-file", short.path()]).contains("at least 32"));
        assert!(
            err(&["--fleet-key-file", "/nonexistent/fleet.key"]).contains("/nonexistent/fleet.key")
        );
        let both = Args::try_parse_from([
            "llm-bridge",
            "--envoy-url",
            "http://127.0.0.1:1/r",
            "--token",
            "t",
            "--replica",
            "a",
            "--fleet-key-file",
            good.path(),
            "--insecure-no-fleet-key",
        ]);
        assert!(both.is_err(), "a key and no key at once is a mistake");
    }

    #[test]
    fn one_nats_authentication_read_from_files() {
        assert_eq!(parse(&[]).unwrap().nats_auth, NatsAuth::None);
        let token = Secret::new("token", " s3cret\n");
        assert_eq!(
            parse(&["--nats-token-file", token.path()])
                .unwrap()
                .nats_auth,
            NatsAuth::Token("s3cret".into())
        );
        assert_eq!(
            parse(&[
                "--nats-user",
                "bridge",
                "--nats-password-file",
                token.path()
            ])
            .unwrap()
            .nats_auth,
            NatsAuth::UserPassword("bridge".into(), "s3cret".into())
        );
        assert!(
            parse(&["--nats-user", "bridge"]).is_err(),
            "a user needs a password"
        );
        assert!(
            parse(&[
                "--nats-token-file",
                token.path(),
                "--nats-nkey-file",
                token.path()
            ])
            .is_err(),
            "one method at a time"
        );
        let empty = Secret::new("empty", "\n");
        assert!(err(&["--nats-token-file", empty.path()]).contains("empty"));
        assert!(err(&["--nats-ca", "/nonexistent/ca.pem"]).contains("--nats-ca"));
        assert!(
            !format!("{:?}", parse(&["--nats-token-file", token.path()]).unwrap())
                .contains("s3cret"),
            "secrets are not printed"
        );
    }

    #[test]
    fn flags_are_checked() {
        assert_eq!(parse(&[]).unwrap().replica, "a");
        assert!(parse(&["--replica", "a b"])
            .unwrap_err()
            .to_string()
            .contains("--replica"));
        assert!(parse(&["--envoy-url", "https://x/r"])
            .unwrap_err()
            .to_string()
            .contains("http://"));
        assert!(parse(&["--envoy-url", "http://x/r?after=1"]).is_err());
        assert!(parse(&["--token", " "])
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(parse(&["--subject-prefix", "a.*"]).is_err());
        assert!(parse(&["--poll-ms", "0"]).is_err());
        assert!(parse(&["--max-message-age-ms", "999"]).is_err());
    }
}
