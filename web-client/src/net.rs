//! The WebSocket to the server: binary frames in, events out, and the
//! reconnect backoff. The socket's callbacks live as long as the socket.

use js_sys::ArrayBuffer;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use web_sys::{BinaryType, CloseEvent, MessageEvent, WebSocket};

/// Something that happened on the socket.
pub(crate) enum NetEvent {
    /// Connected: send `Subscribe` now.
    Open,
    /// A binary message.
    Message(ArrayBuffer),
    /// The socket closed (code and reason as the browser reports them).
    Closed {
        /// WebSocket close code.
        code: u16,
        /// Close reason text.
        reason: String,
    },
}

/// An open (or opening) socket with its callbacks.
pub(crate) struct Socket {
    ws: WebSocket,
    _on_open: Closure<dyn FnMut()>,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
    _on_close: Closure<dyn FnMut(CloseEvent)>,
}

impl Socket {
    /// Opens `url`; every event goes to `handler`.
    pub(crate) fn open(
        url: &str,
        handler: impl Fn(NetEvent) + Clone + 'static,
    ) -> Result<Self, JsValue> {
        let ws = WebSocket::new(url)?;
        ws.set_binary_type(BinaryType::Arraybuffer);
        let h = handler.clone();
        let on_open = Closure::<dyn FnMut()>::new(move || h(NetEvent::Open));
        let h = handler.clone();
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
            if let Ok(buf) = e.data().dyn_into::<ArrayBuffer>() {
                h(NetEvent::Message(buf));
            }
        });
        let on_close = Closure::<dyn FnMut(CloseEvent)>::new(move |e: CloseEvent| {
            handler(NetEvent::Closed {
                code: e.code(),
                reason: e.reason(),
            });
        });
        ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        Ok(Self {
            ws,
            _on_open: on_open,
            _on_message: on_message,
            _on_close: on_close,
        })
    }

    /// Sends a binary message; false if the socket is not open.
    pub(crate) fn send(&self, bytes: &[u8]) -> bool {
        self.ws.ready_state() == WebSocket::OPEN && self.ws.send_with_u8_array(bytes).is_ok()
    }

    /// Bytes queued by the browser and not yet sent.
    pub(crate) fn buffered(&self) -> u32 {
        self.ws.buffered_amount()
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.ws.set_onopen(None);
        self.ws.set_onmessage(None);
        self.ws.set_onclose(None);
        let _ = self.ws.close();
    }
}

/// The servers a page may stream from (`?endpoints=` on its URL: edges
/// behind no load balancer), tried in turn: after a loss the next one is
/// tried at once, and only a whole round of failures waits for the backoff.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Endpoints {
    urls: Vec<String>,
    current: usize,
    /// Failures in a row since the last connection that lasted
    /// [`STABLE_MS`].
    failures: u32,
    /// When the current connection got its Hello (page time, ms).
    connected_at: Option<f64>,
}

/// How long a connection must last for its loss to start a new round: a
/// server that greets a page and closes it at once (full, or the page too
/// slow for it) is backed off from like one that refuses it, not
/// reconnected to twice a second.
pub(crate) const STABLE_MS: f64 = 5_000.0;

/// Most endpoints a page takes from its URL.
pub(crate) const MAX_ENDPOINTS: usize = 16;

impl Endpoints {
    /// `own` (this page's server, `host:port`) when `list` is empty, else
    /// each of `list` (comma-separated `host:port`, or `ws(s)://…` URLs; at
    /// most [`MAX_ENDPOINTS`]), starting at `start` (spread viewers over
    /// them). `scheme` is `ws` or `wss`; `query` (`?token=…`, or empty) is
    /// added only to endpoints on the page's own host name, so a crafted
    /// link cannot send the token elsewhere (others are watched read-only).
    pub(crate) fn new(own: &str, list: &str, scheme: &str, query: &str, start: usize) -> Self {
        let own_host = host_name(own);
        let mut urls: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty() && !e.contains(char::is_whitespace))
            .take(MAX_ENDPOINTS)
            .map(|e| {
                let url = if e.starts_with("ws://") || e.starts_with("wss://") {
                    e.to_owned()
                } else {
                    format!("{scheme}://{}/ws", e.trim_end_matches('/'))
                };
                let authority = url
                    .split("://")
                    .nth(1)
                    .unwrap_or("")
                    .split('/')
                    .next()
                    .unwrap_or("");
                if host_name(authority) == own_host {
                    format!("{url}{query}")
                } else {
                    url
                }
            })
            .collect();
        if urls.is_empty() {
            urls.push(format!("{scheme}://{own}/ws{query}"));
        }
        let current = start % urls.len();
        Self {
            urls,
            current,
            failures: 0,
            connected_at: None,
        }
    }

    /// The one to connect to now.
    pub(crate) fn url(&self) -> &str {
        &self.urls[self.current]
    }

    /// A connection got its Hello at `now_ms`: if it lasts [`STABLE_MS`],
    /// its loss starts a new round.
    pub(crate) fn connected(&mut self, now_ms: f64) {
        self.connected_at = Some(now_ms);
    }

    /// The connection was lost or refused at `now_ms`: moves on to the
    /// next endpoint and says how long to wait first, ms (a moment until a
    /// whole round failed, then the backoff, spread by `jitter` in 0 ..= 1
    /// over ±25 % so the pages a restart dropped do not return in step).
    pub(crate) fn lost(&mut self, now_ms: f64, jitter: f64) -> u32 {
        if self
            .connected_at
            .take()
            .is_some_and(|t| now_ms - t >= STABLE_MS)
        {
            self.failures = 0;
        }
        let n = self.urls.len() as u32;
        self.current = (self.current + 1) % self.urls.len();
        self.failures = self.failures.saturating_add(1);
        if self.failures < n {
            return NEXT_ENDPOINT_MS;
        }
        let spread = 0.75 + 0.5 * jitter.clamp(0.0, 1.0);
        (f64::from(backoff_ms((self.failures - n) / n)) * spread).round() as u32
    }
}

/// Wait before trying the next endpoint, ms (so endpoints that accept and
/// close at once are not hammered).
pub(crate) const NEXT_ENDPOINT_MS: u32 = 250;

/// The host name of `host:port` (IPv6 in brackets kept whole).
fn host_name(authority: &str) -> &str {
    match authority.rsplit_once(':') {
        Some((h, port)) if !port.contains(']') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

/// Milliseconds to wait before reconnect attempt `attempt` (0-based):
/// 0.5 s doubling to at most 10 s.
pub(crate) fn backoff_ms(attempt: u32) -> u32 {
    500u32.saturating_mul(1 << attempt.min(5)).min(10_000)
}

/// Why a connection ended, in words a person reads (no close codes): the
/// server's own reason when it gave one.
pub(crate) fn close_words(code: u16, reason: &str) -> String {
    if !reason.is_empty() {
        return format!("the server ended the connection: {reason}");
    }
    match code {
        1000 => "the server ended the connection",
        1001 => "the server is restarting or shutting down",
        1008 | 1003 => "the server refused this connection",
        1009 => "the server sent more than the page can take",
        1011 => "the server hit an internal error",
        1013 => "the server is busy",
        _ => "the connection was lost",
    }
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::{Endpoints, NEXT_ENDPOINT_MS, STABLE_MS, backoff_ms, close_words};

    #[test]
    fn endpoints_are_tried_in_turn_and_back_off_after_a_round() {
        let mut e = Endpoints::new("here:8080", "", "ws", "", 3);
        assert_eq!(e.url(), "ws://here:8080/ws");
        assert_eq!(e.lost(0.0, 0.5), 500, "one server: the backoff at once");
        let mut e = Endpoints::new(
            "edge1:8080",
            "edge1:8081, wss://elsewhere.example.org/ws ,,bad host",
            "ws",
            "?token=t",
            1,
        );
        assert_eq!(
            e.url(),
            "wss://elsewhere.example.org/ws",
            "the token goes to the page's own host only"
        );
        assert_eq!(
            e.lost(0.0, 0.5),
            NEXT_ENDPOINT_MS,
            "the other edge after a moment"
        );
        assert_eq!(e.url(), "ws://edge1:8081/ws?token=t");
        assert_eq!(e.lost(0.0, 0.5), 500, "both failed: wait");
        assert_eq!(e.lost(0.0, 0.5), 500);
        assert_eq!(e.lost(0.0, 0.5), 1_000, "the second round waits longer");
        // Greeted and closed at once: still backing off.
        e.connected(10_000.0);
        assert_eq!(e.lost(10_100.0, 0.5), 1_000);
        // A connection that lasted: a new round.
        e.connected(20_000.0);
        assert_eq!(e.lost(20_000.0 + STABLE_MS, 0.5), NEXT_ENDPOINT_MS);
        // The backoff is spread by a quarter either way.
        let mut one = Endpoints::new("here:8080", "", "ws", "", 0);
        assert_eq!(one.lost(0.0, 0.0), 375);
        assert_eq!(one.lost(0.0, 1.0), 1_250);
        assert_eq!(super::host_name("[::1]:8080"), "[::1]");
        assert_eq!(super::host_name("[::1]"), "[::1]");
    }

    #[test]
    fn closes_are_told_in_words_not_codes() {
        assert_eq!(close_words(1006, ""), "the connection was lost");
        assert_eq!(
            close_words(1001, ""),
            "the server is restarting or shutting down"
        );
        assert_eq!(
            close_words(1008, "too many connections from this address"),
            "the server ended the connection: too many connections from this address"
        );
        for code in [1000, 1001, 1003, 1006, 1008, 1009, 1011, 1013, 4000] {
            assert!(!close_words(code, "").contains(&code.to_string()));
        }
    }

    #[test]
    fn backoff_doubles_up_to_ten_seconds() {
        assert_eq!(backoff_ms(0), 500);
        assert_eq!(backoff_ms(1), 1_000);
        assert_eq!(backoff_ms(4), 8_000);
        assert_eq!(backoff_ms(5), 10_000);
        assert_eq!(backoff_ms(u32::MAX), 10_000);
    }
}
