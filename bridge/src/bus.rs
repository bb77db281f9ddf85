//! How the bridge connects to NATS: its authentication and TLS from the flags,
//! reconnection forever (the bus may start after the bridge, or go away and
//! return), and which connection errors end the bridge instead.
//!
//! A server that is down is waited for: retrying fixes it. A server that refuses
//! the bridge's credentials is not: retrying the same credentials forever would
//! look like a bus outage in the metrics while the replica quietly routes alone.
//! So an authorization violation (or a seed that cannot sign the server's nonce)
//! ends the bridge with a message naming the flags, and its supervisor shows it
//! (and restarts it with whatever the files hold then).

use std::time::Duration;

use async_nats::{ClientError, ConnectOptions, Event};

use crate::cli::{NatsAuth, Settings};

/// Reconnection attempts back off to at most this.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// The client options the flags ask for (authentication, TLS, reconnects).
pub fn options(s: &Settings) -> anyhow::Result<ConnectOptions> {
    let opts = match &s.nats_auth {
        NatsAuth::None => ConnectOptions::new(),
        NatsAuth::Creds(c) => {
            ConnectOptions::with_credentials(c).map_err(|e| anyhow::anyhow!("--nats-creds: {e}"))?
        }
        NatsAuth::Nkey(seed) => ConnectOptions::with_nkey(seed.clone()),
        NatsAuth::Token(t) => ConnectOptions::with_token(t.clone()),
        NatsAuth::UserPassword(u, p) => {
            ConnectOptions::with_user_and_password(u.clone(), p.clone())
        }
    };
    let mut opts = opts
        .name(format!("llm-bridge {}", s.replica))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            (Duration::from_millis(100) * attempts as u32).min(MAX_RECONNECT_DELAY)
        });
    if let Some(ca) = &s.nats_tls.ca {
        opts = opts.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &s.nats_tls.client {
        opts = opts.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(opts)
}

/// Why `event` should end the bridge, or `None` when waiting may fix it.
pub fn fatal(event: &Event) -> Option<String> {
    match event {
        Event::ServerError(async_nats::ServerError::AuthorizationViolation) => Some(refused()),
        // While connecting, the client reports the error's kind only.
        Event::ClientError(ClientError::Other(kind)) if kind == "authorization violation" => {
            Some(refused())
        }
        // The nkey seed or credentials file cannot sign the server's nonce.
        Event::ClientError(ClientError::Other(kind)) if kind == "failed signing nonce" => Some(
            "the NATS credentials cannot sign the server's challenge: \
             --nats-nkey-file or --nats-creds does not hold a valid nkey seed"
                .to_string(),
        ),
        _ => None,
    }
}

fn refused() -> String {
    "the NATS server refused this bridge's credentials (authorization violation): \
     check --nats-creds, --nats-nkey-file, --nats-token-file or --nats-user and \
     --nats-password-file against the server's authorization"
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(auth: NatsAuth) -> Settings {
        let mut s = crate::cli::testing::parse(&[]).unwrap();
        s.nats_auth = auth;
        s
    }

    #[test]
    fn every_authentication_builds_and_a_bad_credentials_file_is_named() {
        let seed = "SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU";
        let creds = format!(
            "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJqd3QiLCJhbGciOiJlZDI1NTE5In0.e30.sig\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        );
        for auth in [
            NatsAuth::None,
            NatsAuth::Creds(creds),
            NatsAuth::Nkey(seed.into()),
            NatsAuth::Token("t".into()),
            NatsAuth::UserPassword("u".into(), "p".into()),
        ] {
            let what = format!("{auth:?}");
            assert!(options(&settings(auth)).is_ok(), "{what}");
        }
        let e = options(&settings(NatsAuth::Creds("not a creds file".into())))
            .expect_err("a file without a JWT is refused at start");
        assert!(e.to_string().contains("--nats-creds"), "{e}");
    }

    #[test]
    fn only_refused_credentials_end_the_bridge() {
        for e in [
            Event::ServerError(async_nats::ServerError::AuthorizationViolation),
            Event::ClientError(ClientError::Other("authorization violation".into())),
        ] {
            assert!(fatal(&e).unwrap().contains("--nats-token-file"), "{e}");
        }
        let bad_seed = Event::ClientError(ClientError::Other("failed signing nonce".into()));
        assert!(fatal(&bad_seed).unwrap().contains("--nats-nkey-file"));
        for e in [
            Event::Disconnected,
            Event::ClientError(ClientError::Other("IO error".into())),
            Event::ClientError(ClientError::Other("timed out".into())),
            Event::ServerError(async_nats::ServerError::SlowConsumer(1)),
        ] {
            assert_eq!(fatal(&e), None, "{e}: waiting may fix it");
        }
    }
}
