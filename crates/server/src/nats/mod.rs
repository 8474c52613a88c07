//! Beyond one machine: the origin publishes each broadcast on NATS
//! (`origin.rs`) and edges rebuild it and serve viewers (`edge.rs`), with
//! commands forwarded back over request/reply; `wire.rs` is what they say.
//! Both use the Debian `nats-server` and the `async-nats` client, which
//! reconnects on its own: nothing here retries by hand.

pub mod edge;
pub mod origin;
pub mod wire;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, ConnectOptions, Event};

use crate::telemetry::Telemetry;

/// Why publishing or following could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// A subscription could not be made.
    #[error("NATS subscription: {0}")]
    Subscribe(String),
    /// A thread could not be started.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Messages each subscription buffers before the client drops them as a
/// slow consumer (async-nats' default, 65,536, held up to 65,536 messages
/// of `max_payload` in front of the feed's own bounds): two broadcasts of
/// the finest grid, every cell an update, each cut in two parts.
pub const SUBSCRIPTION_CAPACITY: usize = 4 * starling_protocol::limits::MAX_CELLS;

/// TLS to the NATS server beyond what its URL asks (`tls://` asks for TLS
/// with the system's root certificates). Either file set requires TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// Root certificates (PEM) the server's certificate must chain to,
    /// instead of the system's: a private CA's, or any at all in the
    /// container, which has none.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key (PEM), for a server that verifies
    /// its clients (nats-server's `verify`).
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Connects to `url` (`nats://host:4222`, credentials in the URL if the
/// server wants them; `tls` adds TLS settings), retrying in the background
/// until it answers and reconnecting for ever after a loss (async-nats
/// logs each event). `name` shows in the server's monitoring; `telemetry`
/// counts the link (`nats_connected`) and the messages the server dropped
/// for us.
pub async fn connect(
    url: &str,
    tls: &NatsTls,
    name: &str,
    telemetry: Arc<Telemetry>,
) -> Result<Client, async_nats::ConnectError> {
    let mut options = ConnectOptions::new();
    if let Some(ca) = &tls.ca {
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &tls.client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if tls != &NatsTls::default() {
        options = options.require_tls(true);
    }
    options
        .name(name)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2))
        .request_timeout(Some(Duration::from_secs(5)))
        .subscription_capacity(SUBSCRIPTION_CAPACITY)
        .custom_inbox_prefix(wire::INBOX_PREFIX)
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis((100 * attempts as u64).min(1_000))
        })
        .event_callback(move |event| {
            let t = telemetry.clone();
            async move {
                match event {
                    Event::Connected => {
                        t.nats_connected.set(1);
                    }
                    Event::Disconnected | Event::Closed => {
                        t.nats_connected.set(0);
                    }
                    Event::SlowConsumer(_) => t.nats_drop("slow_consumer"),
                    _ => {}
                }
            }
        })
        .connect(url)
        .await
}
