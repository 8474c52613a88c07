//! Behind a reverse proxy (`docker/edges-nginx.conf`), every socket comes
//! from the proxy's address, so the limits that count per client address
//! (viewers, new viewers a second, anonymous requests a second) would
//! count every browser as one: the edges' compose file raised them to the
//! whole server's, and one client could take every slot (found by an
//! audit). A request whose socket comes from a trusted proxy
//! (`trusted_proxies`: addresses or prefixes) is counted by the address
//! the proxy names in `X-Real-IP` instead; from any other peer that header
//! is ignored. Open sockets are still counted by the socket's address: the
//! proxy holds them.

use std::net::IpAddr;

use axum::extract::Request;
use axum::http::HeaderMap;

use super::listen::{PeerGroup, address_group};

/// The header a trusted proxy names the client in (nginx:
/// `proxy_set_header X-Real-IP $remote_addr;`).
pub const REAL_IP: &str = "x-real-ip";

/// The socket's own remote address, in each request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub IpAddr);

/// The peers whose `X-Real-IP` is believed: addresses and prefixes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<(IpAddr, u32)>);

impl TrustedProxies {
    /// Parses `a.b.c.d`, `a.b.c.d/n`, `v6` or `v6/n` entries; the first
    /// that is none of these is returned as the error.
    pub fn parse(list: &[String]) -> Result<Self, String> {
        list.iter()
            .map(|entry| {
                let (addr, bits) = match entry.split_once('/') {
                    Some((a, b)) => (a, Some(b)),
                    None => (entry.as_str(), None),
                };
                let ip = addr
                    .trim()
                    .parse::<IpAddr>()
                    .map_err(|_| entry.clone())?
                    .to_canonical();
                let most = if ip.is_ipv4() { 32 } else { 128 };
                let bits = match bits {
                    None => most,
                    Some(b) => b
                        .trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|&b| b <= most)
                        .ok_or_else(|| entry.clone())?,
                };
                Ok((ip, bits))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether any proxy is trusted.
    pub fn any(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether `peer` is a trusted proxy.
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.0.iter().any(|&(net, bits)| {
            net.is_ipv4() == peer.is_ipv4()
                && crate::address::block(peer, bits, bits) == crate::address::block(net, bits, bits)
        })
    }

    /// The client a request from `peer` is for: the address in
    /// `X-Real-IP` when `peer` is a trusted proxy and the header holds one
    /// address, else None (the socket's address counts).
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        if !self.contains(peer) {
            return None;
        }
        let client: IpAddr = headers.get(REAL_IP)?.to_str().ok()?.trim().parse().ok()?;
        Some(client.to_canonical())
    }

    /// Counts `req` against its client's address group when it came
    /// through a trusted proxy that named the client; whether it did.
    pub fn attribute(&self, req: &mut Request) -> bool {
        if !self.any() {
            return false;
        }
        let Some(PeerAddr(peer)) = req.extensions().get::<PeerAddr>().copied() else {
            return false;
        };
        let Some(client) = self.client(peer, req.headers()) else {
            return false;
        };
        req.extensions_mut()
            .insert(PeerGroup(address_group(client)));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_a_trusted_peer_names_the_client() {
        let p = TrustedProxies::parse(&[
            "10.0.0.0/8".into(),
            "192.0.2.7".into(),
            "2001:db8::/32".into(),
        ])
        .unwrap();
        assert!(p.contains(ip("10.200.3.4")) && p.contains(ip("192.0.2.7")));
        assert!(p.contains(ip("2001:db8:5::1")) && p.contains(ip("::ffff:10.1.1.1")));
        assert!(!p.contains(ip("192.0.2.8")) && !p.contains(ip("11.0.0.1")));
        assert!(!p.contains(ip("2001:db9::1")));
        let mut h = HeaderMap::new();
        h.insert(REAL_IP, " 203.0.113.9 ".parse().unwrap());
        assert_eq!(p.client(ip("10.1.2.3"), &h), Some(ip("203.0.113.9")));
        assert_eq!(p.client(ip("198.51.100.1"), &h), None, "an untrusted peer");
        h.insert(REAL_IP, "203.0.113.9, 10.0.0.1".parse().unwrap());
        assert_eq!(p.client(ip("10.1.2.3"), &h), None, "not one address");
        assert_eq!(p.client(ip("10.1.2.3"), &HeaderMap::new()), None);
        assert!(!TrustedProxies::default().contains(ip("127.0.0.1")));
    }

    #[test]
    fn bad_entries_are_returned() {
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "host.example",
            "10.0.0.0/x",
            "1.2.3.4/",
        ] {
            assert_eq!(
                TrustedProxies::parse(&[bad.into()]),
                Err(bad.into()),
                "{bad:?}"
            );
        }
        assert!(TrustedProxies::parse(&["0.0.0.0/0".into(), "::1".into()]).is_ok());
    }
}
