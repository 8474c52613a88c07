//! Browser safety, as Jupyter and webpack's dev server do it. Every request
//! must name this server in `Host`: an IP address, `localhost`, or a
//! configured public name (so a DNS-rebinding page cannot reach a loopback
//! server through its own domain). A request that changes something (any
//! method but GET and HEAD) and the WebSocket upgrade must come from this
//! server's own pages, or from an allowed origin, when a browser says where
//! it came from (`Origin`): another site's page can neither drive the flock
//! nor open a socket with a visitor's access. Clients that send no `Origin`
//! (curl, scripts) are not browsers acting for someone else and pass.
//!
//! With tokens configured, requests presenting no valid token count against
//! their address's rate (`anonymous_requests_per_s`); health checks and
//! metrics against a rate of their own (`probe_requests_per_s`).

use std::net::IpAddr;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::TokenQuery;
use super::error::ApiError;
use super::listen::PeerGroup;
use super::proxy::TrustedProxies;
use super::shared::{ANONYMOUS_REQUEST_BURST, PROBE_REQUEST_BURST, Shared};

/// Which hosts and origins the server answers.
#[derive(Debug, Clone, Default)]
pub struct Allowed {
    /// Names (without port) the server is reached by besides IP addresses
    /// and `localhost`, lower case.
    pub public_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) whose pages may change things,
    /// besides the server's own, lower case.
    pub origins: Vec<String>,
    /// Peers whose `X-Real-IP` names the client the limits count
    /// (`proxy.rs`).
    pub proxies: TrustedProxies,
}

/// The host part of a `Host` value or an origin's authority (no port).
fn hostname(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        // [v6]:port
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

impl Allowed {
    /// Whether a `Host` header value names this server.
    fn host_ok(&self, host: &str) -> bool {
        let name = hostname(host).to_ascii_lowercase();
        name.parse::<IpAddr>().is_ok() || name == "localhost" || self.public_hosts.contains(&name)
    }

    /// Whether a request from a page of `origin` may change things on the
    /// server reached as `host`.
    fn origin_ok(&self, origin: &str, host: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        let authority = origin.split_once("://").map(|(_, a)| a);
        authority == Some(host.to_ascii_lowercase().as_str()) || self.origins.contains(&origin)
    }
}

fn refuse(field: &str, detail: String) -> Response {
    ApiError::forbidden(Some(field.to_owned()), detail).into_response()
}

/// The middleware: checks `Host` on every request, `Origin` on changes
/// and upgrades, and holds requests presenting no valid token to their
/// address's rate (when tokens are configured).
pub async fn check(State(s): State<Shared>, mut req: Request, next: Next) -> Response {
    let allowed = &s.0.allowed;
    // Through a trusted proxy, the client it names is who is counted.
    let forwarded = allowed.proxies.attribute(&mut req);
    let headers = req.headers();
    let host = header_str(headers, header::HOST).unwrap_or("");
    if !allowed.host_ok(host) {
        return refuse(
            "Host",
            format!(
                "Host {host:?} is not this server: allowed an IP address, localhost, or a name given with --public-host"
            ),
        );
    }
    // Presenting no token (when tokens are configured), each request
    // counts against its address's rate: every request costs a worker's
    // time, which the tick's threads share. Probes and scrapes have a rate
    // of their own (a load balancer's health checks share its address
    // with the pages it passes on), unless a proxy passed them on for a
    // client: then they count as its other requests do.
    let probe = !forwarded && matches!(req.uri().path(), "/healthz" | "/readyz" | "/metrics");
    let query = Query::<TokenQuery>::try_from_uri(req.uri())
        .unwrap_or_default()
        .0;
    let presented = query.presented(headers);
    let unknown_token = s.0.tokens.unknown(presented);
    if let Some(PeerGroup(ip)) = req.extensions().get::<PeerGroup>().copied()
        && s.0.tokens.any()
        && s.0.tokens.actor(presented).account.is_none()
    {
        // Probes have a rate of their own; each refusal names its setting.
        let limits = &s.0.limits;
        let (bucket, rate, burst, what, setting) = if probe {
            (
                &s.0.probe_requests,
                limits.probe_requests_per_s,
                PROBE_REQUEST_BURST,
                "health checks or metrics scrapes",
                "probe_requests_per_s",
            )
        } else {
            (
                &s.0.anonymous_requests,
                limits.anonymous_requests_per_s,
                ANONYMOUS_REQUEST_BURST,
                "requests",
                "anonymous_requests_per_s",
            )
        };
        if !bucket.take(ip) {
            if req.uri().path() == "/ws" {
                s.0.telemetry.viewer_refused("anonymous_rate");
            }
            return ApiError::rate_limited(format!(
                "this address made more than {rate} {what} a second presenting no token, in bursts of {burst} ({setting})"
            ))
            .into_response();
        }
    }
    let changes = !matches!(*req.method(), Method::GET | Method::HEAD);
    let upgrade = headers.contains_key(header::UPGRADE);
    if (changes || upgrade)
        && let Some(origin) = header_str(headers, header::ORIGIN)
        && !allowed.origin_ok(origin, host)
    {
        return refuse(
            "Origin",
            format!(
                "a page from {origin:?} may not change this server or open its socket: allowed this server's own pages and origins given with --allow-origin"
            ),
        );
    }
    let response = next.run(req).await;
    if unknown_token && response.status() == StatusCode::FORBIDDEN {
        return told_token_unknown(response).await;
    }
    response
}

/// A refusal for want of a role, to a request whose token matched none:
/// says so in its `detail` (it was served as an anonymous viewer's). A
/// body that is not such a JSON object is passed on as it is.
async fn told_token_unknown(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let mut json = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
    let told = json
        .as_mut()
        .and_then(|j| j.get_mut("detail"))
        .and_then(|d| match d {
            serde_json::Value::String(detail) => {
                detail.push_str(
                    " (the token presented is not one this server knows: the request was served as an anonymous viewer's)",
                );
                Some(())
            }
            _ => None,
        });
    let body = match (told, json) {
        (Some(()), Some(json)) => serde_json::to_vec(&json).map_or(bytes, Into::into),
        _ => bytes,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let a = Allowed {
            public_hosts: vec!["flock.example.org".into()],
            origins: vec!["https://dash.example.org".into()],
            proxies: TrustedProxies::default(),
        };
        for host in [
            "127.0.0.1:8080",
            "[::1]:8080",
            "localhost:8080",
            "10.0.0.5",
            "Flock.Example.org:443",
        ] {
            assert!(a.host_ok(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "",
        ] {
            assert!(!a.host_ok(host), "{host}");
        }
        assert!(a.origin_ok("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(a.origin_ok("https://dash.example.org", "flock.example.org"));
        assert!(!a.origin_ok("http://evil.example", "127.0.0.1:8080"));
        assert!(!a.origin_ok("null", "127.0.0.1:8080"));
        assert!(!a.origin_ok("http://127.0.0.1:9999", "127.0.0.1:8080"));
    }
}
