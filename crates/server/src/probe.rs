//! `starling healthcheck`: asks a running server's `/healthz` and succeeds
//! only on `200`. For container health checks, where no curl exists (the
//! runtime image is just the binary and the viewer's files).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Why a health probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No connection, or it broke.
    #[error("health probe of {addr}: {source}")]
    Io {
        /// The address probed.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
    /// The server answered something other than 200.
    #[error("health probe of {addr}: answered {status:?}, expected HTTP 200")]
    Unhealthy {
        /// The address probed.
        addr: SocketAddr,
        /// The status line received.
        status: String,
    },
}

/// GETs `http://addr/healthz` with `timeout` on each step.
pub fn probe(addr: SocketAddr, timeout: Duration) -> Result<(), ProbeError> {
    let io = |source| ProbeError::Io { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).map_err(io)?;
    // The status line is all we need; read at most 4 KiB.
    let mut buf = Vec::with_capacity(256);
    s.take(4096).read_to_end(&mut buf).map_err(io)?;
    let text = String::from_utf8_lossy(&buf);
    let status = text.lines().next().unwrap_or_default().to_owned();
    let mut parts = status.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(v), Some("200")) if v.starts_with("HTTP/1.") => Ok(()),
        _ => Err(ProbeError::Unhealthy { addr, status }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn answer_once(reply: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            // Read the whole request before answering.
            let mut req = Vec::new();
            let mut byte = [0u8; 1];
            while !req.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap() == 1 {
                req.push(byte[0]);
            }
            c.write_all(reply.as_bytes()).unwrap();
        });
        addr
    }

    #[test]
    fn healthy_only_on_200() {
        let ok = answer_once("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        probe(ok, Duration::from_secs(5)).unwrap();
        let bad = answer_once("HTTP/1.1 503 Service Unavailable\r\n\r\n");
        let e = probe(bad, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("503"), "{e}");
    }

    #[test]
    fn nothing_listening_is_an_error_naming_the_address() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // The listener is dropped: the port refuses connections.
        let e = probe(addr, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }
}
