//! Which IP addresses web_fetch may never reach, whatever DNS answers (SECURITY-CASES.md
//! 55-56): the gateway's own host, its pod network, its cloud's metadata service, and every
//! range that is not the public internet.
//!
//! Addresses are classified after resolution and after the URL parser has normalised the
//! host, so `2130706433`, `0177.0.0.1`, `0x7f.1` and `[::ffff:127.0.0.1]` are all seen as
//! 127.0.0.1. IPv6 forms that carry an IPv4 address (v4-mapped, v4-compatible, NAT64,
//! 6to4) are judged by the address they carry.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is never reachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// 0.0.0.0/8, `::`: "this host" (reaches the local machine on Linux).
    Unspecified,
    /// 127.0.0.0/8, `::1`.
    Loopback,
    /// 10/8, 172.16/12, 192.168/16 (RFC 1918).
    Private,
    /// 100.64.0.0/10 (RFC 6598, carrier-grade NAT; also some clouds' metadata).
    SharedAddressSpace,
    /// 169.254.169.254, 169.254.170.2, 100.100.100.200, 192.0.0.192, fd00:ec2::254: cloud
    /// metadata and credential services.
    CloudMetadata,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// fc00::/7 (unique local), fec0::/10 (deprecated site-local).
    UniqueLocal,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// 240.0.0.0/4, 192.0.0.0/24, 198.18.0.0/15, 100::/64, 64:ff9b:1::/48, Teredo
    /// 2001::/32 and other ranges that are not the public internet.
    Reserved,
}

impl Blocked {
    /// Short name, as in result details (`loopback`, `private`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Blocked::Unspecified => "unspecified",
            Blocked::Loopback => "loopback",
            Blocked::Private => "private",
            Blocked::SharedAddressSpace => "shared-address-space",
            Blocked::CloudMetadata => "cloud-metadata",
            Blocked::LinkLocal => "link-local",
            Blocked::UniqueLocal => "unique-local",
            Blocked::Multicast => "multicast",
            Blocked::Broadcast => "broadcast",
            Blocked::Reserved => "reserved",
        }
    }
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Metadata services by address (AWS/GCP/Azure/OpenStack, ECS task credentials, Alibaba,
/// Oracle): named apart so a refusal says what was at stake.
const METADATA_V4: [Ipv4Addr; 4] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// AWS's IPv6 instance metadata endpoint.
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Why `ip` may not be reached, or `None` for a public address.
pub fn classify(ip: IpAddr) -> Option<Blocked> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// [`classify`] for IPv4.
pub fn classify_v4(ip: Ipv4Addr) -> Option<Blocked> {
    let [a, b, c, _] = ip.octets();
    if METADATA_V4.contains(&ip) {
        return Some(Blocked::CloudMetadata);
    }
    Some(match (a, b, c) {
        (0, _, _) => Blocked::Unspecified,
        (127, _, _) => Blocked::Loopback,
        (10, _, _) => Blocked::Private,
        (172, 16..=31, _) => Blocked::Private,
        (192, 168, _) => Blocked::Private,
        (100, 64..=127, _) => Blocked::SharedAddressSpace,
        (169, 254, _) => Blocked::LinkLocal,
        (224..=239, _, _) => Blocked::Multicast,
        (255, 255, 255) if ip == Ipv4Addr::BROADCAST => Blocked::Broadcast,
        (240..=255, _, _) => Blocked::Reserved,
        // IETF protocol assignments (192.0.0.0/24), benchmarking (198.18.0.0/15).
        (192, 0, 0) | (198, 18..=19, _) => Blocked::Reserved,
        _ => return None,
    })
}

/// [`classify`] for IPv6, judging embedded IPv4 addresses by their IPv4 rules.
pub fn classify_v6(ip: Ipv6Addr) -> Option<Blocked> {
    if ip.is_unspecified() {
        return Some(Blocked::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Blocked::Loopback);
    }
    if ip == METADATA_V6 {
        return Some(Blocked::CloudMetadata);
    }
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    let s = ip.segments();
    Some(match s[0] {
        0xfc00..=0xfdff => Blocked::UniqueLocal,
        0xfe80..=0xfebf => Blocked::LinkLocal,
        0xfec0..=0xfeff => Blocked::UniqueLocal,
        0xff00..=0xffff => Blocked::Multicast,
        // Discard-only (100::/64).
        0x0100 if s[1..4] == [0, 0, 0] => Blocked::Reserved,
        // Local-use NAT64 (64:ff9b:1::/48): translated into an operator's own network.
        0x0064 if s[1] == 0xff9b && s[2] == 1 => Blocked::Reserved,
        // Teredo (2001::/32): tunnels to an obfuscated IPv4 address nobody checks.
        0x2001 if s[1] == 0 => Blocked::Reserved,
        // The rest of ::/8 (IPv4-compatible forms are handled above) is reserved.
        0x0000..=0x00ff => Blocked::Reserved,
        _ => return None,
    })
}

/// The IPv4 address an IPv6 one stands for: v4-mapped `::ffff:a.b.c.d`, v4-compatible
/// `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d` (RFC 6052), 6to4 `2002:aabb:ccdd::/48`.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some(low(hi, lo)),
        // v4-compatible, but not :: and ::1 (handled by the caller).
        [0, 0, 0, 0, 0, 0, hi, lo] => Some(low(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(low(hi, lo)),
        [0x2002, hi, lo, ..] => Some(low(hi, lo)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Option<Blocked> {
        classify(s.parse().unwrap())
    }

    #[test]
    fn every_forbidden_v4_range_is_named() {
        for (ip, want) in [
            ("0.0.0.0", Blocked::Unspecified),
            ("0.1.2.3", Blocked::Unspecified),
            ("127.0.0.1", Blocked::Loopback),
            ("127.255.255.254", Blocked::Loopback),
            ("10.0.0.1", Blocked::Private),
            ("10.255.255.255", Blocked::Private),
            ("172.16.0.1", Blocked::Private),
            ("172.31.255.255", Blocked::Private),
            ("192.168.1.1", Blocked::Private),
            ("100.64.0.1", Blocked::SharedAddressSpace),
            ("100.127.255.255", Blocked::SharedAddressSpace),
            ("169.254.169.254", Blocked::CloudMetadata),
            ("169.254.170.2", Blocked::CloudMetadata),
            ("100.100.100.200", Blocked::CloudMetadata),
            ("192.0.0.192", Blocked::CloudMetadata),
            ("169.254.0.1", Blocked::LinkLocal),
            ("224.0.0.1", Blocked::Multicast),
            ("239.255.255.250", Blocked::Multicast),
            ("255.255.255.255", Blocked::Broadcast),
            ("240.0.0.1", Blocked::Reserved),
            ("192.0.0.8", Blocked::Reserved),
            ("198.18.0.1", Blocked::Reserved),
            ("198.19.255.255", Blocked::Reserved),
        ] {
            assert_eq!(c(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn public_v4_addresses_pass_including_the_edges_of_forbidden_ranges() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.215.14",
            "9.255.255.255",
            "11.0.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "223.255.255.255",
            "198.17.255.255",
            "198.20.0.0",
            "192.0.1.1",
        ] {
            assert_eq!(c(ip), None, "{ip}");
        }
    }

    #[test]
    fn every_forbidden_v6_range_is_named() {
        for (ip, want) in [
            ("::", Blocked::Unspecified),
            ("::1", Blocked::Loopback),
            ("fc00::1", Blocked::UniqueLocal),
            ("fd12:3456::1", Blocked::UniqueLocal),
            ("fec0::1", Blocked::UniqueLocal),
            ("fe80::1", Blocked::LinkLocal),
            ("febf::1", Blocked::LinkLocal),
            ("ff02::1", Blocked::Multicast),
            ("fd00:ec2::254", Blocked::CloudMetadata),
            ("100::1", Blocked::Reserved),
            ("64:ff9b:1::1", Blocked::Reserved),
            ("2001::1", Blocked::Reserved),
            ("::2:0:0:1", Blocked::Reserved),
        ] {
            assert_eq!(c(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn ipv6_forms_of_ipv4_addresses_are_judged_as_ipv4() {
        for (ip, want) in [
            ("::ffff:127.0.0.1", Some(Blocked::Loopback)),
            ("::ffff:7f00:1", Some(Blocked::Loopback)),
            ("::ffff:169.254.169.254", Some(Blocked::CloudMetadata)),
            ("::ffff:10.1.2.3", Some(Blocked::Private)),
            ("::ffff:0.0.0.0", Some(Blocked::Unspecified)),
            ("::127.0.0.1", Some(Blocked::Loopback)),
            ("::192.168.0.1", Some(Blocked::Private)),
            ("64:ff9b::7f00:1", Some(Blocked::Loopback)),
            ("64:ff9b::a9fe:a9fe", Some(Blocked::CloudMetadata)),
            ("2002:7f00:1::1", Some(Blocked::Loopback)),
            ("2002:c0a8:101::1", Some(Blocked::Private)),
            ("::ffff:1.1.1.1", None),
            ("64:ff9b::808:808", None),
            ("2002:808:808::1", None),
        ] {
            assert_eq!(c(ip), want, "{ip}");
        }
    }

    #[test]
    fn public_v6_addresses_pass() {
        for ip in [
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450:4001::1",
            "fbff::1",
            "ff::1:1",
        ] {
            // ff::1:1 is in ::/8: reserved.
            let want = (ip == "ff::1:1").then_some(Blocked::Reserved);
            assert_eq!(c(ip), want, "{ip}");
        }
    }
}
