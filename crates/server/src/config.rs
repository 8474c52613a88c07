//! The server's configuration: defaults, then an optional TOML file, then
//! `STARLING_*` environment variables and flags (the binary merges those
//! two through clap), validated in one place.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use starling_protocol::Role;
use starling_sim::params::used_only_by;
use starling_sim::{Params, SwarmConfig};

use crate::command::AgentCaps;
use crate::engine::checkpoint;
use crate::files::same_place;
use crate::http::auth::Tokens;
use crate::http::guard::Allowed;
use crate::http::listen::ConnLimits;
use crate::http::proxy::TrustedProxies;
use crate::http::shared::{Limits, MAX_SERVED_POPULATION};
use crate::nats::NatsTls;

/// Everything `starling serve` needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on. Default `127.0.0.1:8080`.
    pub bind: SocketAddr,
    /// Boids at start (and after a reset). Default 5000.
    pub population: usize,
    /// Seed of the run. Default 1.
    pub seed: u64,
    /// Simulation parameters (`[params]` in TOML; unspecified ones default).
    pub params: Params,
    /// Swarm-metric distances (`[swarm]` in TOML: `safety_m`, `link_m`).
    pub swarm: SwarmConfig,
    /// Most snapshots per second sent to each viewer. Default 30, range 1 ..= 120.
    pub snapshot_hz: u32,
    /// Seconds between forced keyframes. Default 10, range 1 ..= 3600.
    pub keyframe_interval_s: f32,
    /// Directory of the built web viewer. Default `web-client/dist`.
    pub web_dir: PathBuf,
    /// Checkpoint file: resumed from at start when present, written every
    /// `checkpoint_every_s` and on shutdown.
    pub state_file: Option<PathBuf>,
    /// Seconds between checkpoints while running (with `state_file`): a
    /// crash loses at most this much. Default 30, range 1 ..= 86400.
    pub checkpoint_every_s: f32,
    /// Record every applied command (and state digests) here, for `starling replay`.
    pub record: Option<PathBuf>,
    /// Serve this recording (`starling replay FILE --serve`) instead of a
    /// live flock. Excludes `record` and `state_file`.
    #[serde(skip)]
    pub replay: Option<PathBuf>,
    /// Tokens granting the viewer role (TOML: a string or a list).
    #[serde(deserialize_with = "one_or_many")]
    pub viewer_token: Vec<String>,
    /// Tokens granting the pilot role, one per pilot: each has its own
    /// rate, agent cap and agents (TOML: a string or a list).
    #[serde(deserialize_with = "one_or_many")]
    pub pilot_token: Vec<String>,
    /// Tokens granting the operator role (TOML: a string or a list). One is
    /// required on a non-loopback bind.
    #[serde(deserialize_with = "one_or_many")]
    pub operator_token: Vec<String>,
    /// Names the server is reached by besides IP addresses and `localhost`
    /// (`Host` must be one of them), e.g. `flock.example.org`.
    #[serde(deserialize_with = "one_or_many")]
    pub public_host: Vec<String>,
    /// Origins (`https://dash.example.org`) whose pages may change things
    /// and open the WebSocket, besides the server's own.
    #[serde(deserialize_with = "one_or_many")]
    pub allow_origin: Vec<String>,
    /// Reverse proxies (addresses or prefixes, `10.0.0.0/8`) whose
    /// `X-Real-IP` header names the client that the per-address limits
    /// count; from any other peer the header is ignored (`http/proxy.rs`).
    #[serde(deserialize_with = "one_or_many")]
    pub trusted_proxies: Vec<String>,
    /// Seconds a request's headers may take to arrive, and an idle
    /// keep-alive connection may wait for its next request. Default 10,
    /// range 1 ..= 300.
    pub header_timeout_s: f32,
    /// Most open sockets from one remote address (IPv6: one /56; a reverse
    /// proxy counts as one). Default 256, range 1 ..= 100000.
    pub max_connections_per_ip: usize,
    /// Most open sockets in all (viewers included). Default `max_viewers`
    /// + 1024, range `max_viewers + 1` ..= 1000000.
    pub max_connections: Option<usize>,
    /// Most boids the flock may have (spawns and population changes beyond
    /// it are refused; the API schema says so). Default and most
    /// [`MAX_SERVED_POPULATION`] (1048576, the most one snapshot carries),
    /// range `population` ..= 1048576.
    pub max_population: usize,
    /// Most open viewer connections. Default 1000, range 1 ..= 100000.
    pub max_viewers: usize,
    /// Most open viewer connections from one remote address (IPv6: one
    /// /56; a reverse proxy counts as one). Default 64, range 1 ..=
    /// 100000 (above `max_viewers` it changes nothing, and above
    /// `max_viewers_per_network` it is held to that: the start warns): a
    /// few addresses cannot take every viewer slot.
    pub max_viewers_per_ip: usize,
    /// Most open viewer connections from one network, an IPv4 /24 or an
    /// IPv6 /48 (a site's allocation holds 256 /56 blocks, each its own
    /// address to `max_viewers_per_ip`). Default 256, range 1 ..= 100000:
    /// one site's addresses cannot take every viewer slot.
    pub max_viewers_per_network: usize,
    /// New viewer connections one address (IPv6: one /56) may open a
    /// second, in bursts of `max_viewers_per_ip` (more get 429). Default
    /// 2, range 0.01 ..= 100000: each new viewer costs its first send
    /// (every cell located and summarised), so an address reconnecting in
    /// a loop is refused rather than served.
    pub viewer_connects_per_s: f32,
    /// Requests one address (IPv6: one /56) may make a second presenting
    /// no valid token, when tokens are configured, in bursts of 100 (more
    /// get 429). Default 20, range 0.1 ..= 100000: every page, file, API
    /// call and upgrade counts (a page's load is about ten) but health
    /// checks and metrics; a request presenting a valid token (a bearer
    /// header, or `?token=`) is not counted. Behind a reverse proxy, raise it.
    pub anonymous_requests_per_s: f32,
    /// Health checks and metrics scrapes (`/healthz`, `/readyz`,
    /// `/metrics`) one address (IPv6: one /56) may make a second presenting
    /// no valid token, when tokens are configured, in bursts of 50 (more
    /// get 429), apart from `anonymous_requests_per_s`. Default 10, range
    /// 0.1 ..= 100000: a load balancer or Prometheus checks every few
    /// seconds; raise it when many checkers share one address (a NAT).
    pub probe_requests_per_s: f32,
    /// The bytes the whole-world stream's sockets may hold, at most: each
    /// whole-world viewer's keeps a buffer as large as the largest frame it
    /// was sent. A subscription, or a frame larger than a viewer was sent
    /// before (the flock grew), that would pass it gets `Close(Busy)`
    /// naming this setting; a viewer alone on the stream never does, and
    /// the interest stream is counted apart (`interest_socket_bytes`).
    /// Default 1073741824 (1 GiB: the keyframes of 127 viewers at
    /// 1,048,576 boids, 134 at a million, every allowed viewer at
    /// 100,000), range 65536 ..= 1099511627776.
    pub whole_world_bytes: usize,
    /// The bytes the interest stream's sockets may hold, at most: each
    /// interest viewer's keeps a buffer as large as the largest batch it
    /// was sent (about 1.1 MiB at most), and reserves 131072 as it joins,
    /// so the pool admits at most this / 131072 viewers. Batches, and the
    /// budgets they are sized by, are held to what is left (never past
    /// it); a subscription that would pass it gets `Close(Busy)` naming
    /// this setting (a viewer alone on the stream never does). Default
    /// 1073741824 (1 GiB: about 930 viewers' largest batches, so hostile
    /// viewers fill it no sooner than they fill the viewer slots, which
    /// takes 4 networks), range 65536 ..= 1099511627776.
    pub interest_socket_bytes: usize,
    /// Seconds a viewer may accept nothing before it is dropped. Default 10, range 1 ..= 600.
    pub stall_timeout_s: f32,
    /// Seconds a trajectory export may take in all, however steadily its
    /// client reads: one still running is cut (its transfer ends in an
    /// error) and the export slot is free again. Default 600 (a whole
    /// history, about 90 MB, needs 1.2 Mbit/s), range 1 ..= 86400.
    pub export_deadline_s: f32,
    /// Agents one pilot token may have at once. Default 8, range 1 ..= 256.
    pub pilot_agents_each: usize,
    /// Agents all pilots may have at once. Default 64, range 1 ..= 1024.
    pub pilot_agents_total: usize,
    /// Commands per second a pilot token may send, REST and WebSocket
    /// together. Default 20, range 0.1 ..= 1000.
    pub pilot_rate_per_s: f32,
    /// The least role that may export trajectories (`viewer`, `pilot` or
    /// `operator`). Default `operator`: an export is heavy.
    pub trajectories_role: String,
    /// Log as JSON lines instead of text.
    pub log_json: bool,
    /// NATS server (`nats://host:4222`): `serve` publishes every broadcast
    /// there for edges; `edge` (which requires it) serves them.
    pub nats: Option<String>,
    /// The secret edges forward commands with; the origin takes forwarded
    /// commands only with it (none: edges are read-only). At least 16 bytes.
    pub nats_secret: Option<String>,
    /// The subjects' prefix, so several flocks can share a NATS server.
    /// Default `starling`: letters, digits, `-` and `_` in `.`-separated
    /// tokens, at most 64 bytes.
    pub nats_subject: String,
    /// Root certificates (PEM) the NATS server's certificate must chain
    /// to, instead of the system's; requires TLS.
    pub nats_ca: Option<PathBuf>,
    /// A client certificate (PEM) for a NATS server that verifies its
    /// clients; requires TLS, and `nats_key`.
    pub nats_cert: Option<PathBuf>,
    /// The key (PEM) of `nats_cert`.
    pub nats_key: Option<PathBuf>,
    /// The top-level keys the TOML file set (`population`, `params`, …),
    /// so a mode that takes the flock from elsewhere can refuse them.
    #[serde(skip)]
    pub file_keys: Vec<String>,
    /// The flags (or their `STARLING_*` variables) given that make a new
    /// flock (`--population`, `--seed`, `--tick-hz`, `--dims`), so a
    /// resumed checkpoint can say they are not used.
    #[serde(skip)]
    pub flock_flags: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        let l = Limits::default();
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            population: 5_000,
            seed: 1,
            params: Params::default(),
            swarm: SwarmConfig::default(),
            snapshot_hz: l.snapshot_hz,
            keyframe_interval_s: 10.0,
            web_dir: PathBuf::from("web-client/dist"),
            state_file: None,
            checkpoint_every_s: 30.0,
            record: None,
            replay: None,
            viewer_token: Vec::new(),
            pilot_token: Vec::new(),
            operator_token: Vec::new(),
            header_timeout_s: 10.0,
            max_connections_per_ip: 256,
            max_connections: None,
            public_host: Vec::new(),
            allow_origin: Vec::new(),
            trusted_proxies: Vec::new(),
            max_viewers: l.max_viewers,
            max_viewers_per_ip: l.max_viewers_per_ip,
            max_viewers_per_network: l.max_viewers_per_network,
            viewer_connects_per_s: l.viewer_connects_per_s,
            anonymous_requests_per_s: l.anonymous_requests_per_s,
            probe_requests_per_s: l.probe_requests_per_s,
            whole_world_bytes: l.whole_world_bytes,
            interest_socket_bytes: l.interest_socket_bytes,
            max_population: l.max_population,
            stall_timeout_s: l.stall_timeout.as_secs_f32(),
            export_deadline_s: l.export_deadline.as_secs_f32(),
            pilot_agents_each: l.pilot_caps.each,
            pilot_agents_total: l.pilot_caps.total,
            pilot_rate_per_s: l.pilot_rate_per_s,
            trajectories_role: l.trajectories_role.name().to_owned(),
            log_json: false,
            nats: None,
            nats_secret: None,
            nats_subject: "starling".to_owned(),
            nats_ca: None,
            nats_cert: None,
            nats_key: None,
            file_keys: Vec::new(),
            flock_flags: Vec::new(),
        }
    }
}

/// A configuration value that is not allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("config `{field}` = {value}: allowed {allowed}")]
pub struct ConfigError {
    /// The setting.
    pub field: String,
    /// What was given.
    pub value: String,
    /// What is allowed.
    pub allowed: String,
}

/// Most tokens one role may have (each is compared on every request).
pub const MAX_TOKENS_PER_ROLE: usize = 64;
/// Sockets allowed besides `max_viewers` when `max_connections` is not set
/// (REST calls, viewers being turned away).
pub const CONNECTIONS_BESIDES_VIEWERS: usize = 1024;
/// Most public host names, and most allowed origins.
pub const MAX_ALLOWED_NAMES: usize = 64;

/// A TOML value that is one string or a list of them.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    // Untagged, serde's error would say only "data did not match any
    // variant of untagged enum OneOrMany".
    match OneOrMany::deserialize(d) {
        Ok(OneOrMany::One(t)) => Ok(vec![t]),
        Ok(OneOrMany::Many(v)) => Ok(v),
        Err(_) => Err(serde::de::Error::custom(
            "expected a token (a string) or a list of tokens (strings)",
        )),
    }
}

fn role_named(name: &str) -> Option<Role> {
    [Role::Viewer, Role::Pilot, Role::Operator]
        .into_iter()
        .find(|r| r.name() == name)
}

/// A host name as `Host` carries it, without port: letters, digits, `-`, `.`.
fn is_host(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 253
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
}

/// `http://host[:port]` or `https://host[:port]`.
fn is_origin(v: &str) -> bool {
    let Some(authority) = v
        .strip_prefix("http://")
        .or_else(|| v.strip_prefix("https://"))
    else {
        return false;
    };
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "1"));
    is_host(host) && port.parse::<u16>().is_ok_and(|p| p > 0)
}

fn err(field: &str, value: impl ToString, allowed: &str) -> ConfigError {
    ConfigError {
        field: field.to_owned(),
        value: value.to_string(),
        allowed: allowed.to_owned(),
    }
}

/// The config file's keys that make a new flock: resuming a checkpoint,
/// a replay or an edge does not use them.
pub const FLOCK_KEYS: [&str; 3] = ["population", "seed", "params"];

/// The most a config file may hold (a full one is a few kilobytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Most bytes of each NATS TLS file (`nats_ca`, `nats_cert`, `nats_key`):
/// a CA bundle of a few hundred certificates is about 200 KB.
pub const MAX_TLS_FILE_BYTES: u64 = 1 << 20;

impl Config {
    /// Reads a TOML file (unknown keys are errors naming the line).
    pub fn from_toml_file(path: &Path) -> Result<Self, ConfigError> {
        let text =
            crate::files::read_text(path, MAX_CONFIG_BYTES, "MAX_CONFIG_BYTES").map_err(|e| {
                err(
                    "config file",
                    path.display(),
                    &format!("a readable regular file of at most {MAX_CONFIG_BYTES} bytes ({e})"),
                )
            })?;
        // The line and the message, not the toml crate's echo of the line
        // (a 200 KB line of `[` came back whole, twice).
        let invalid = |e: toml::de::Error| {
            let line = e.span().map_or(0, |sp| {
                text[..sp.start.min(text.len())].matches('\n').count() + 1
            });
            err(
                "config file",
                path.display(),
                &format!("valid TOML (line {line}: {})", e.message().trim_end()),
            )
        };
        // (Typed from the text, not the table: its errors name the line.)
        let mut config: Self = toml::from_str(&text).map_err(invalid)?;
        let table: toml::Table = text.parse().map_err(invalid)?;
        config.check_params_model(&table)?;
        config.file_keys = table.keys().cloned().collect();
        Ok(config)
    }

    /// Refuses a `[params]` key the configured model does not use (as a
    /// scenario file does): it would be accepted and do nothing.
    fn check_params_model(&self, table: &toml::Table) -> Result<(), ConfigError> {
        let Some(toml::Value::Table(given)) = table.get("params") else {
            return Ok(());
        };
        let model = self.params.model;
        for (key, value) in given {
            if let Some(users) = used_only_by(key, model) {
                return Err(err(
                    &format!("params.{key}"),
                    value,
                    &format!(
                        "unset: it is used only by model {users} and this config's model is {}",
                        model.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks the files a served flock will write, before it starts (so a
    /// session is not run only to be lost at its first checkpoint or at
    /// shutdown): a recording's directory must exist (one that exists is
    /// kept: the session records to a new name), and the state file's
    /// directory must exist and take a new file.
    pub fn check_paths(&self) -> Result<(), ConfigError> {
        let dir_of = |p: &Path| match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        // (One that exists is kept: the session records to a new name.)
        if let Some(p) = &self.record
            && (p.is_dir() || !dir_of(p).is_dir())
        {
            return Err(err(
                "record",
                p.display(),
                "a file (not a directory) in an existing directory",
            ));
        }
        self.check_nats_tls_files()?;
        // A recording where checkpoints land was replaced by the first one
        // (renamed over it) while the recorder wrote on into the old file.
        if let (Some(record), Some(state)) = (&self.record, &self.state_file) {
            let temp = checkpoint::temp_path(state);
            if same_place(record, state) || same_place(record, &temp) {
                return Err(err(
                    "record",
                    record.display(),
                    &format!(
                        "a file other than state_file {} and the checkpoint written next to it ({})",
                        state.display(),
                        temp.display()
                    ),
                ));
            }
        }
        if let Some(p) = &self.state_file {
            let dir = dir_of(p);
            if p.is_dir() || !dir.is_dir() {
                return Err(err(
                    "state_file",
                    p.display(),
                    "a file in an existing directory",
                ));
            }
            // The checkpoint is written next to it, then renamed over it.
            // (Named anew each try: a probe a killed server left, say as
            // pid 1 in a container, is in the way of no later one.)
            let writable = (0..8).any(|k| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let probe = dir.join(format!(
                    ".starling-probe-{}-{nanos}-{k}",
                    std::process::id()
                ));
                let made = std::fs::File::create_new(&probe).is_ok();
                if made {
                    let _ = std::fs::remove_file(&probe);
                }
                made
            });
            if !writable {
                return Err(err(
                    "state_file",
                    p.display(),
                    "a file in a directory this server may write (checkpoints are written there)",
                ));
            }
        }
        Ok(())
    }

    /// The NATS TLS settings, as the client takes them.
    pub fn nats_tls(&self) -> NatsTls {
        NatsTls {
            ca: self.nats_ca.clone(),
            client: self.nats_cert.clone().zip(self.nats_key.clone()),
        }
    }

    /// Reads the NATS TLS files now: the client reads them only as it
    /// connects, and retries for ever, so a missing or wrong file would
    /// show only as a link that never comes up.
    fn check_nats_tls_files(&self) -> Result<(), ConfigError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let read = |field: &str, path: &Path| {
            crate::files::read_bytes(path, MAX_TLS_FILE_BYTES, "MAX_TLS_FILE_BYTES").map_err(|e| {
                err(
                    field,
                    path.display(),
                    &format!(
                        "a readable regular PEM file of at most {MAX_TLS_FILE_BYTES} bytes ({e})"
                    ),
                )
            })
        };
        let certificates = |field: &str, path: &Path| {
            let pem = read(field, path)?;
            let found: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
            match found {
                Ok(certs) if !certs.is_empty() => Ok(()),
                Ok(_) => Err(err(
                    field,
                    path.display(),
                    "a PEM file with at least one certificate (none found)",
                )),
                Err(e) => Err(err(
                    field,
                    path.display(),
                    &format!("a readable PEM file of certificates ({e})"),
                )),
            }
        };
        if let Some(ca) = &self.nats_ca {
            certificates("nats_ca", ca)?;
        }
        if let Some(cert) = &self.nats_cert {
            certificates("nats_cert", cert)?;
        }
        if let Some(key) = &self.nats_key {
            PrivateKeyDer::from_pem_slice(&read("nats_key", key)?).map_err(|e| {
                err(
                    "nats_key",
                    key.display(),
                    &format!("a readable PEM file holding a private key ({e})"),
                )
            })?;
        }
        Ok(())
    }

    /// What is allowed but probably not meant, said at start: a per-address
    /// viewer cap above the per-network one (raised for one address behind
    /// a NAT, say, before `max_viewers_per_network` existed) is held to it.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.max_viewers_per_ip > self.max_viewers_per_network {
            out.push(format!(
                "max_viewers_per_ip ({}) is above max_viewers_per_network ({}): one address holds at most its network's viewers; raise max_viewers_per_network too",
                self.max_viewers_per_ip, self.max_viewers_per_network
            ));
        }
        out
    }

    /// Checks every value and the rule that a public bind needs an operator token.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(replay) = &self.replay {
            for (field, set) in [("record", &self.record), ("state_file", &self.state_file)] {
                if let Some(path) = set {
                    return Err(err(
                        field,
                        path.display(),
                        &format!(
                            "unset while serving the replay of {} (a replay is read-only)",
                            replay.display()
                        ),
                    ));
                }
            }
        }
        self.params
            .validate()
            .map_err(|e| err(&format!("params.{}", e.field), &e.value, &e.allowed))?;
        self.swarm
            .validate()
            // A resumed flock's size is checked when it is read (app.rs).
            .and_then(|()| match self.state_file.as_ref().filter(|p| p.exists()) {
                Some(_) => Ok(()),
                None => self.swarm.validate_for(self.population),
            })
            .map_err(|e| err(&format!("swarm.{}", e.field), &e.value, &e.allowed))?;
        if self.population > MAX_SERVED_POPULATION {
            return Err(err(
                "population",
                self.population,
                &format!("0 ..= {MAX_SERVED_POPULATION}"),
            ));
        }
        if !(self.population.max(1)..=MAX_SERVED_POPULATION).contains(&self.max_population) {
            return Err(err(
                "max_population",
                self.max_population,
                &format!(
                    "{} ..= {MAX_SERVED_POPULATION} (at least population)",
                    self.population.max(1)
                ),
            ));
        }
        if !(1..=120).contains(&self.snapshot_hz) {
            return Err(err("snapshot_hz", self.snapshot_hz, "1 ..= 120"));
        }
        let in_range = |v: f32, lo: f32, hi: f32| v.is_finite() && (lo..=hi).contains(&v);
        if !in_range(self.keyframe_interval_s, 1.0, 3600.0) {
            return Err(err(
                "keyframe_interval_s",
                self.keyframe_interval_s,
                "1 ..= 3600",
            ));
        }
        if !in_range(self.checkpoint_every_s, 1.0, 86_400.0) {
            return Err(err(
                "checkpoint_every_s",
                self.checkpoint_every_s,
                "1 ..= 86400",
            ));
        }
        if !in_range(self.stall_timeout_s, 1.0, 600.0) {
            return Err(err("stall_timeout_s", self.stall_timeout_s, "1 ..= 600"));
        }
        if !in_range(self.export_deadline_s, 1.0, 86_400.0) {
            return Err(err(
                "export_deadline_s",
                self.export_deadline_s,
                "1 ..= 86400",
            ));
        }
        if !in_range(self.pilot_rate_per_s, 0.1, 1000.0) {
            return Err(err(
                "pilot_rate_per_s",
                self.pilot_rate_per_s,
                "0.1 ..= 1000",
            ));
        }
        if !(1..=100_000).contains(&self.max_viewers) {
            return Err(err("max_viewers", self.max_viewers, "1 ..= 100000"));
        }
        for (field, cap) in [
            ("max_viewers_per_ip", self.max_viewers_per_ip),
            ("max_viewers_per_network", self.max_viewers_per_network),
        ] {
            if !(1..=100_000).contains(&cap) {
                return Err(err(field, cap, "1 ..= 100000"));
            }
        }
        if !in_range(self.viewer_connects_per_s, 0.01, 100_000.0) {
            return Err(err(
                "viewer_connects_per_s",
                self.viewer_connects_per_s,
                "0.01 ..= 100000",
            ));
        }
        if !in_range(self.anonymous_requests_per_s, 0.1, 100_000.0) {
            return Err(err(
                "anonymous_requests_per_s",
                self.anonymous_requests_per_s,
                "0.1 ..= 100000",
            ));
        }
        if !in_range(self.probe_requests_per_s, 0.1, 100_000.0) {
            return Err(err(
                "probe_requests_per_s",
                self.probe_requests_per_s,
                "0.1 ..= 100000",
            ));
        }
        for (field, bytes) in [
            ("whole_world_bytes", self.whole_world_bytes),
            ("interest_socket_bytes", self.interest_socket_bytes),
        ] {
            if !(1 << 16..=1 << 40).contains(&bytes) {
                return Err(err(field, bytes, "65536 ..= 1099511627776"));
            }
        }
        if !in_range(self.header_timeout_s, 1.0, 300.0) {
            return Err(err("header_timeout_s", self.header_timeout_s, "1 ..= 300"));
        }
        if !(1..=100_000).contains(&self.max_connections_per_ip) {
            return Err(err(
                "max_connections_per_ip",
                self.max_connections_per_ip,
                "1 ..= 100000",
            ));
        }
        if !(self.max_viewers + 1..=1_000_000).contains(&self.max_connections()) {
            return Err(err(
                "max_connections",
                self.max_connections(),
                &format!(
                    "{} ..= 1000000 (more than max_viewers)",
                    self.max_viewers + 1
                ),
            ));
        }
        if !(1..=256).contains(&self.pilot_agents_each) {
            return Err(err(
                "pilot_agents_each",
                self.pilot_agents_each,
                "1 ..= 256",
            ));
        }
        if !(1..=1024).contains(&self.pilot_agents_total) {
            return Err(err(
                "pilot_agents_total",
                self.pilot_agents_total,
                "1 ..= 1024",
            ));
        }
        if let Some(url) = &self.nats
            && (url.is_empty() || url.len() > 512 || url.chars().any(char::is_whitespace))
        {
            return Err(err(
                "nats",
                format!("{url:?}"),
                "a NATS URL such as nats://127.0.0.1:4222 (at most 512 bytes, no spaces)",
            ));
        }
        if let Some(secret) = &self.nats_secret
            && !(16..=256).contains(&secret.len())
        {
            return Err(err(
                "nats_secret",
                format!("({} bytes)", secret.len()),
                "16 ..= 256 bytes",
            ));
        }
        match (&self.nats_cert, &self.nats_key) {
            (Some(_), None) => {
                return Err(err(
                    "nats_key",
                    "(none)",
                    "the key of nats_cert (PEM), given with it",
                ));
            }
            (None, Some(k)) => {
                return Err(err(
                    "nats_key",
                    k.display(),
                    "unset unless nats_cert is set (the client certificate it is the key of)",
                ));
            }
            _ => {}
        }
        for (field, set) in [("nats_ca", &self.nats_ca), ("nats_cert", &self.nats_cert)] {
            if let (Some(path), None) = (set, &self.nats) {
                return Err(err(
                    field,
                    path.display(),
                    "unset unless nats is set (TLS to the NATS server)",
                ));
            }
        }
        let token_ok = |t: &str| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if self.nats_subject.len() > 64
            || !self.nats_subject.split('.').all(token_ok)
            || self.nats_subject.split('.').next() == Some(crate::nats::wire::INBOX_PREFIX)
        {
            return Err(err(
                "nats_subject",
                format!("{:?}", self.nats_subject),
                "letters, digits, - and _ in .-separated tokens, at most 64 bytes, the first not _INBOX (where replies go)",
            ));
        }
        if role_named(&self.trajectories_role).is_none() {
            return Err(err(
                "trajectories_role",
                format!("{:?}", self.trajectories_role),
                "viewer | pilot | operator",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (field, tokens) in [
            ("viewer_token", &self.viewer_token),
            ("pilot_token", &self.pilot_token),
            ("operator_token", &self.operator_token),
        ] {
            if tokens.len() > MAX_TOKENS_PER_ROLE {
                return Err(err(
                    field,
                    format!("{} tokens", tokens.len()),
                    &format!("at most {MAX_TOKENS_PER_ROLE}"),
                ));
            }
            for t in tokens {
                if t.len() < 8 || t.len() > 256 || t.chars().any(|c| c.is_whitespace() || c == ',')
                {
                    return Err(err(
                        field,
                        "(hidden)",
                        "8 ..= 256 characters without spaces or commas (commas separate tokens)",
                    ));
                }
                if !seen.insert(t) {
                    return Err(err(
                        field,
                        "(hidden)",
                        "a token given once (it would grant two roles or be one pilot twice)",
                    ));
                }
            }
        }
        for (field, list, ok) in [
            (
                "public_host",
                &self.public_host,
                is_host as fn(&str) -> bool,
            ),
            ("allow_origin", &self.allow_origin, is_origin),
        ] {
            if list.len() > MAX_ALLOWED_NAMES {
                return Err(err(
                    field,
                    format!("{} entries", list.len()),
                    &format!("at most {MAX_ALLOWED_NAMES}"),
                ));
            }
            if let Some(bad) = list.iter().find(|v| !ok(v)) {
                let allowed = if field == "public_host" {
                    "a host name without scheme, port or path (flock.example.org)"
                } else {
                    "an origin: http:// or https://, a host and an optional port, no path"
                };
                return Err(err(field, format!("{bad:?}"), allowed));
            }
        }
        if self.trusted_proxies.len() > MAX_ALLOWED_NAMES {
            return Err(err(
                "trusted_proxies",
                format!("{} entries", self.trusted_proxies.len()),
                &format!("at most {MAX_ALLOWED_NAMES}"),
            ));
        }
        if let Err(bad) = TrustedProxies::parse(&self.trusted_proxies) {
            return Err(err(
                "trusted_proxies",
                format!("{bad:?}"),
                "an IP address or a prefix (10.0.0.0/8, 2001:db8::/32)",
            ));
        }
        if !self.bind.ip().is_loopback() && self.operator_token.is_empty() {
            return Err(err(
                "bind",
                self.bind,
                "a loopback address, unless operator_token is set (a public server needs one)",
            ));
        }
        Ok(())
    }

    /// The configured tokens.
    pub fn tokens(&self) -> Tokens {
        Tokens::new(&self.viewer_token, &self.pilot_token, &self.operator_token)
    }

    /// The hosts and origins browsers may reach the server from.
    pub fn allowed(&self) -> Allowed {
        let lower = |v: &[String]| v.iter().map(|s| s.to_ascii_lowercase()).collect();
        Allowed {
            public_hosts: lower(&self.public_host),
            origins: lower(&self.allow_origin),
            // Checked by `validate`.
            proxies: TrustedProxies::parse(&self.trusted_proxies).unwrap_or_default(),
        }
    }

    /// The limits on sockets.
    pub fn conn_limits(&self) -> ConnLimits {
        ConnLimits {
            header_timeout: Duration::from_secs_f32(self.header_timeout_s),
            per_ip: self.max_connections_per_ip,
            total: self.max_connections(),
        }
    }

    /// Most open sockets in all.
    fn max_connections(&self) -> usize {
        self.max_connections
            .unwrap_or(self.max_viewers + CONNECTIONS_BESIDES_VIEWERS)
    }

    /// The caps the connections enforce.
    pub fn limits(&self) -> Limits {
        Limits {
            snapshot_hz: self.snapshot_hz,
            max_viewers: self.max_viewers,
            max_viewers_per_ip: self.max_viewers_per_ip,
            max_viewers_per_network: self.max_viewers_per_network,
            viewer_connects_per_s: self.viewer_connects_per_s,
            anonymous_requests_per_s: self.anonymous_requests_per_s,
            probe_requests_per_s: self.probe_requests_per_s,
            whole_world_bytes: self.whole_world_bytes,
            interest_socket_bytes: self.interest_socket_bytes,
            stall_timeout: Duration::from_secs_f32(self.stall_timeout_s),
            export_deadline: Duration::from_secs_f32(self.export_deadline_s),
            body_deadline: Duration::from_secs_f32(self.header_timeout_s),
            pilot_caps: AgentCaps {
                each: self.pilot_agents_each,
                total: self.pilot_agents_total,
            },
            pilot_rate_per_s: self.pilot_rate_per_s,
            trajectories_role: role_named(&self.trajectories_role).unwrap_or(Role::Operator),
            max_population: self.max_population,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_public_binds_need_a_token() {
        Config::default().validate().unwrap();
        let public = Config {
            bind: "0.0.0.0:8080".parse().unwrap(),
            ..Config::default()
        };
        assert_eq!(public.validate().unwrap_err().field, "bind");
        let guarded = Config {
            operator_token: vec!["s3cret-token".into()],
            ..public
        };
        guarded.validate().unwrap();
        let twice = Config {
            pilot_token: vec!["s3cret-token".into()],
            ..guarded
        };
        assert_eq!(twice.validate().unwrap_err().field, "operator_token");
        let names = |host: &str, origin: &str| Config {
            public_host: vec![host.into()],
            allow_origin: vec![origin.into()],
            ..Config::default()
        };
        names("flock.example.org", "https://dash.example.org:8443")
            .validate()
            .unwrap();
        let e = names("https://flock.example.org", "https://a.example").validate();
        assert_eq!(e.unwrap_err().field, "public_host");
        let e = names("flock.example.org", "dash.example.org").validate();
        assert_eq!(e.unwrap_err().field, "allow_origin");
        let e = names("flock.example.org", "https://dash.example.org/app").validate();
        assert_eq!(e.unwrap_err().field, "allow_origin");
    }

    #[test]
    fn a_served_flock_is_at_most_what_one_snapshot_carries() {
        // A flock over the protocol's MAX_BOIDS (1,048,576) was accepted
        // up to the engine's 2,000,000, and no snapshot of it could be
        // built: every viewer stayed on the last frame.
        use starling_protocol::limits::MAX_BOIDS;
        assert!(Limits::default().max_population <= MAX_BOIDS);
        Config {
            population: MAX_BOIDS,
            max_population: MAX_BOIDS,
            ..Config::default()
        }
        .validate()
        .unwrap();
        let e = Config {
            population: MAX_BOIDS + 1,
            ..Config::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "population");
        assert!(e.to_string().contains("0 ..= 1048576"), "{e}");
        let e = Config {
            max_population: 1_500_000,
            ..Config::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "max_population");
        assert!(e.to_string().contains("1500000"), "{e}");
    }

    #[test]
    fn a_config_param_of_another_model_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("starling-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "[params]\nvas_rep_gain = 0.1\n").unwrap();
        let e = Config::from_toml_file(&file).unwrap_err();
        assert_eq!(e.field, "params.vas_rep_gain");
        assert!(
            e.to_string().contains("used only by model vasarhelyi"),
            "{e}"
        );
        std::fs::write(
            &file,
            "[params]\nmodel = \"vasarhelyi\"\nvas_rep_gain = 0.1\n",
        )
        .unwrap();
        Config::from_toml_file(&file).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// NATS TLS settings come in working sets, and their files are read
    /// before the server starts (the client would read them only as it
    /// connects, and retry a bad one for ever).
    #[test]
    fn nats_tls_files_are_checked_before_the_server_starts() {
        let dir = crate::scratch_dir("nats-tls");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["starling".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let (pem, key_pem) = (
            write("c.pem", &cert.pem()),
            write("c.key", &key.serialize_pem()),
        );
        let not_pem = write("notes.txt", "not a certificate\n");
        let tls = |ca: Option<&PathBuf>, cert: Option<&PathBuf>, key: Option<&PathBuf>| Config {
            nats: Some("nats://127.0.0.1:4222".into()),
            nats_ca: ca.cloned(),
            nats_cert: cert.cloned(),
            nats_key: key.cloned(),
            ..Config::default()
        };
        let good = tls(Some(&pem), Some(&pem), Some(&key_pem));
        good.validate().unwrap();
        good.check_paths().unwrap();
        assert_eq!(good.nats_tls().client, Some((pem.clone(), key_pem.clone())));
        for (config, field) in [
            (tls(None, Some(&pem), None), "nats_key"),
            (tls(None, None, Some(&key_pem)), "nats_key"),
            (
                Config {
                    nats: None,
                    ..tls(Some(&pem), None, None)
                },
                "nats_ca",
            ),
        ] {
            assert_eq!(config.validate().unwrap_err().field, field);
        }
        let missing = dir.join("missing.pem");
        let huge = write("huge.pem", &cert.pem().repeat(4000));
        let zero = PathBuf::from("/dev/zero");
        for (config, field, words) in [
            (tls(Some(&not_pem), None, None), "nats_ca", "none found"),
            (tls(Some(&missing), None, None), "nats_ca", "readable"),
            // Read as regular files within a limit: a device was read
            // until memory ran out, a folder or FIFO is no PEM file.
            (tls(Some(&dir), None, None), "nats_ca", "not a regular file"),
            (
                tls(Some(&huge), None, None),
                "nats_ca",
                "MAX_TLS_FILE_BYTES",
            ),
            (
                tls(None, Some(&pem), Some(&zero)),
                "nats_key",
                "not a regular file",
            ),
            (
                tls(None, Some(&key_pem), Some(&key_pem)),
                "nats_cert",
                "none found",
            ),
            (
                tls(None, Some(&pem), Some(&not_pem)),
                "nats_key",
                "private key",
            ),
        ] {
            config.validate().unwrap();
            let e = config.check_paths().unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().contains(words), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A recording at the state file's path was replaced by the first
    /// checkpoint (renamed over it) while the recorder wrote on into the
    /// old file: the session was lost without a word.
    #[test]
    fn a_recording_where_checkpoints_land_is_refused() {
        let dir = crate::scratch_dir("rec-state");
        let state = dir.join("state.json");
        let at = |record: PathBuf| Config {
            state_file: Some(state.clone()),
            record: Some(record),
            ..Config::default()
        };
        for clash in [
            state.clone(),
            dir.join(".").join("state.json"),
            dir.join("state.tmp"),
        ] {
            let e = at(clash.clone()).check_paths().unwrap_err();
            assert_eq!(e.field, "record", "{clash:?}: {e}");
            assert!(e.to_string().contains("state_file"), "{e}");
        }
        at(dir.join("session.jsonl")).check_paths().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A device is refused unread (`/dev/zero` was read until memory ran out).
    #[test]
    fn a_config_file_that_is_no_regular_file_is_refused() {
        let e = Config::from_toml_file(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.field, "config file");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn an_export_deadline_is_read_from_toml_and_refused_out_of_range() {
        let c: Config = toml::from_str("export_deadline_s = 90.0\n").unwrap();
        assert_eq!(c.limits().export_deadline, Duration::from_secs(90));
        for bad in [0.5, 86_401.0, f32::NAN] {
            let e = Config {
                export_deadline_s: bad,
                ..Config::default()
            }
            .validate()
            .unwrap_err();
            assert_eq!(e.field, "export_deadline_s");
            assert!(e.to_string().contains("1 ..= 86400"), "{e}");
        }
    }

    /// A per-address viewer cap above the per-network one is allowed, and
    /// said at start (both settings named).
    #[test]
    fn a_per_address_cap_above_the_networks_is_warned_of() {
        let c = Config::default();
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        let nat = Config {
            max_viewers_per_ip: 1000,
            ..Config::default()
        };
        nat.validate().unwrap();
        let w = nat.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("max_viewers_per_ip (1000)")
                && w[0].contains("max_viewers_per_network (256)")
        );
    }

    #[test]
    fn a_nats_subject_is_named_when_refused() {
        for bad in ["", "a..b", "a b", "_INBOX", "_INBOX.flock", "x.>"] {
            let c = Config {
                nats_subject: bad.into(),
                ..Config::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("nats_subject"), "{bad:?}: {e}");
        }
        for good in ["starling", "flock-2.eu_west", "_INBOXES"] {
            let c = Config {
                nats_subject: good.into(),
                ..Config::default()
            };
            c.validate().unwrap();
        }
    }

    #[test]
    fn trusted_proxies_are_addresses_or_prefixes() {
        let c = Config {
            trusted_proxies: vec!["10.0.0.0/8".into(), "::1".into()],
            ..Config::default()
        };
        c.validate().unwrap();
        assert!(c.allowed().proxies.contains("10.9.8.7".parse().unwrap()));
        for bad in ["nginx", "10.0.0.0/40"] {
            let c = Config {
                trusted_proxies: vec![bad.into()],
                ..Config::default()
            };
            let e = c.validate().unwrap_err();
            assert_eq!(e.field, "trusted_proxies");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn toml_errors_name_the_key() {
        let e = toml::from_str::<Config>("snapshot_hz = 30\nbogus = 1\n").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = toml::from_str::<Config>("operator_token = [\"abcdefgh\", 5]\n").unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("operator_token") && e.contains("a list of tokens"),
            "{e}"
        );
        let c: Config = toml::from_str(
            "population = 100\npilot_token = [\"pilot-one-x\", \"pilot-two-x\"]\noperator_token = \"operator-x\"\n[params]\nw_sep = 2.5\n",
        )
        .unwrap();
        assert_eq!(c.pilot_token.len(), 2);
        assert_eq!(c.operator_token, ["operator-x"]);
        assert_eq!(c.population, 100);
        assert_eq!(c.params.w_sep, 2.5);
        let bad = Config {
            snapshot_hz: 0,
            ..Config::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "snapshot_hz");
    }
}
