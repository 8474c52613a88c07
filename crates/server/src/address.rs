//! Address blocks: how clients are grouped by the network they come from,
//! for the limits that count per client (`http/listen.rs`'s address groups)
//! and per network ([`network`]: the viewer connections a network holds,
//! `engine/interest.rs`'s linear slots).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The network `ip` comes from: its IPv4 /24 or its IPv6 /48 (a site's
/// allocation, which gives it 256 of the /56 blocks a client counts as).
pub fn network(ip: IpAddr) -> IpAddr {
    block(ip, 24, 48)
}

/// The block of `ip` with an IPv4 prefix of `v4_bits` and an IPv6 prefix of
/// `v6_bits` (IPv4-mapped IPv6 counts as its IPv4 address).
pub fn block(ip: IpAddr, v4_bits: u32, v6_bits: u32) -> IpAddr {
    let v4 = |a: Ipv4Addr| {
        let mask = u32::MAX.checked_shl(32 - v4_bits.min(32)).unwrap_or(0);
        IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
    };
    match ip {
        IpAddr::V4(a) => v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(a) => v4(a),
            None => {
                let mask = u128::MAX.checked_shl(128 - v6_bits.min(128)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_prefix_and_mapped_ipv4_is_ipv4() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(block(ip("192.0.2.7"), 24, 48), ip("192.0.2.0"));
        assert_eq!(block(ip("192.0.2.7"), 32, 56), ip("192.0.2.7"));
        assert_eq!(block(ip("::ffff:192.0.2.7"), 24, 48), ip("192.0.2.0"));
        assert_eq!(
            block(ip("2001:db8:1:2ff::1"), 32, 56),
            ip("2001:db8:1:200::")
        );
        assert_eq!(block(ip("2001:db8:1:2ff::1"), 24, 48), ip("2001:db8:1::"));
        assert_eq!(block(ip("10.1.2.3"), 0, 0), ip("0.0.0.0"));
    }
}
