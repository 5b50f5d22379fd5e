//! The few frames the VMM's end of the guest's wire speaks: Ethernet II carrying IPv4 ICMP echo
//! (request and reply) and ARP (request and reply), built and checked byte by byte.

use std::net::Ipv4Addr;

pub(crate) const ETH_HDR_LEN: usize = 14;
pub(crate) const IPV4_HDR_LEN: usize = 20;
pub(crate) const ICMP_HDR_LEN: usize = 8;
pub(crate) const ARP_LEN: usize = 28;
pub(crate) const ETHERTYPE_IPV4: u16 = 0x0800;
pub(crate) const ETHERTYPE_ARP: u16 = 0x0806;
const IPPROTO_ICMP: u8 = 1;
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_ECHO_REQUEST: u8 = 8;
const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;
/// Shortest Ethernet frame without its FCS; shorter frames are padded with zeros.
const ETH_MIN_LEN: usize = 60;

pub(crate) type Mac = [u8; 6];
pub(crate) const BROADCAST: Mac = [0xff; 6];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("frame of {0} bytes is too short")]
    TooShort(usize),
    #[error("IPv4 header: {0}")]
    BadIpHeader(&'static str),
    #[error("IPv4 header checksum does not add up")]
    BadIpChecksum,
    #[error("ICMP checksum does not add up")]
    BadIcmpChecksum,
    #[error("ARP: {0}")]
    BadArp(&'static str),
}

/// What a frame from the guest is, as far as this module understands it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// ICMP echo request or reply (`reply` tells which), checksums verified.
    Echo {
        reply: bool,
        src_mac: Mac,
        dst_mac: Mac,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        id: u16,
        seq: u16,
        payload: &'a [u8],
    },
    /// ARP request or reply (`reply` tells which) for Ethernet/IPv4.
    Arp {
        reply: bool,
        sender_mac: Mac,
        sender_ip: Ipv4Addr,
        target_mac: Mac,
        target_ip: Ipv4Addr,
    },
    /// Anything else: its EtherType (and, for IPv4, its protocol number).
    Other {
        ethertype: u16,
        ip_protocol: Option<u8>,
    },
}

/// The Internet checksum (RFC 1071): the ones' complement of the ones' complement sum of the
/// 16-bit big-endian words (an odd last byte is padded with zero). A block that contains its
/// own correct checksum sums to 0.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn mac_at(b: &[u8], at: usize) -> Mac {
    b[at..at + 6].try_into().unwrap()
}

fn ip_at(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

fn eth_header(out: &mut Vec<u8>, dst: Mac, src: Mac, ethertype: u16) {
    out.extend_from_slice(&dst);
    out.extend_from_slice(&src);
    out.extend_from_slice(&ethertype.to_be_bytes());
}

/// Ethernet + IPv4 + ICMP echo (request or reply) with correct checksums.
#[allow(clippy::too_many_arguments)]
pub fn echo(
    reply: bool,
    src_mac: Mac,
    dst_mac: Mac,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    seq: u16,
    payload: &[u8],
) -> Vec<u8> {
    let ip_len = IPV4_HDR_LEN + ICMP_HDR_LEN + payload.len();
    let mut f = Vec::with_capacity(ETH_HDR_LEN + ip_len);
    eth_header(&mut f, dst_mac, src_mac, ETHERTYPE_IPV4);
    let ip = f.len();
    f.extend_from_slice(&[0x45, 0]); // version 4, IHL 5; DSCP/ECN 0
    f.extend_from_slice(&(ip_len as u16).to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes()); // identification
    f.extend_from_slice(&[0x40, 0]); // don't fragment
    f.extend_from_slice(&[64, IPPROTO_ICMP, 0, 0]); // TTL, protocol, checksum (below)
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    let c = checksum(&f[ip..ip + IPV4_HDR_LEN]);
    f[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
    let icmp = f.len();
    let kind = if reply {
        ICMP_ECHO_REPLY
    } else {
        ICMP_ECHO_REQUEST
    };
    f.extend_from_slice(&[kind, 0, 0, 0]);
    f.extend_from_slice(&id.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(payload);
    let c = checksum(&f[icmp..]);
    f[icmp + 2..icmp + 4].copy_from_slice(&c.to_be_bytes());
    if f.len() < ETH_MIN_LEN {
        f.resize(ETH_MIN_LEN, 0);
    }
    f
}

/// An ARP packet (request when `reply` is false) for Ethernet/IPv4. Requests go to broadcast.
pub fn arp(
    reply: bool,
    sender_mac: Mac,
    sender_ip: Ipv4Addr,
    target_mac: Mac,
    target_ip: Ipv4Addr,
) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_MIN_LEN);
    let dst = if reply { target_mac } else { BROADCAST };
    eth_header(&mut f, dst, sender_mac, ETHERTYPE_ARP);
    f.extend_from_slice(&1u16.to_be_bytes()); // hardware: Ethernet
    f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    f.extend_from_slice(&[6, 4]);
    let op = if reply { ARP_REPLY } else { ARP_REQUEST };
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&sender_mac);
    f.extend_from_slice(&sender_ip.octets());
    f.extend_from_slice(&target_mac);
    f.extend_from_slice(&target_ip.octets());
    f.resize(ETH_MIN_LEN, 0);
    f
}

/// Parses a frame; IPv4/ICMP echo and ARP are checked (lengths, checksums), the rest is `Other`.
pub fn parse(f: &[u8]) -> Result<Frame<'_>, PacketError> {
    if f.len() < ETH_HDR_LEN {
        return Err(PacketError::TooShort(f.len()));
    }
    let dst_mac = mac_at(f, 0);
    let src_mac = mac_at(f, 6);
    let ethertype = be16(f, 12);
    let body = &f[ETH_HDR_LEN..];
    match ethertype {
        ETHERTYPE_ARP => parse_arp(body),
        ETHERTYPE_IPV4 => parse_ipv4(body, src_mac, dst_mac),
        _ => Ok(Frame::Other {
            ethertype,
            ip_protocol: None,
        }),
    }
}

fn parse_arp(b: &[u8]) -> Result<Frame<'_>, PacketError> {
    if b.len() < ARP_LEN {
        return Err(PacketError::TooShort(ETH_HDR_LEN + b.len()));
    }
    if be16(b, 0) != 1 || be16(b, 2) != ETHERTYPE_IPV4 || b[4] != 6 || b[5] != 4 {
        return Err(PacketError::BadArp("not Ethernet/IPv4"));
    }
    let reply = match be16(b, 6) {
        ARP_REQUEST => false,
        ARP_REPLY => true,
        _ => return Err(PacketError::BadArp("unknown operation")),
    };
    Ok(Frame::Arp {
        reply,
        sender_mac: mac_at(b, 8),
        sender_ip: ip_at(b, 14),
        target_mac: mac_at(b, 18),
        target_ip: ip_at(b, 24),
    })
}

fn parse_ipv4(b: &[u8], src_mac: Mac, dst_mac: Mac) -> Result<Frame<'_>, PacketError> {
    if b.len() < IPV4_HDR_LEN {
        return Err(PacketError::TooShort(ETH_HDR_LEN + b.len()));
    }
    if b[0] >> 4 != 4 {
        return Err(PacketError::BadIpHeader("version is not 4"));
    }
    let ihl = usize::from(b[0] & 0xf) * 4;
    let total = usize::from(be16(b, 2));
    if ihl < IPV4_HDR_LEN || total < ihl || total > b.len() {
        return Err(PacketError::BadIpHeader("bad header or total length"));
    }
    if checksum(&b[..ihl]) != 0 {
        return Err(PacketError::BadIpChecksum);
    }
    let protocol = b[9];
    if protocol != IPPROTO_ICMP {
        return Ok(Frame::Other {
            ethertype: ETHERTYPE_IPV4,
            ip_protocol: Some(protocol),
        });
    }
    if be16(b, 6) & 0x3fff != 0 {
        return Err(PacketError::BadIpHeader("fragmented ICMP"));
    }
    // Ethernet padding after the IP datagram is not part of it.
    let icmp = &b[ihl..total];
    if icmp.len() < ICMP_HDR_LEN {
        return Err(PacketError::TooShort(ETH_HDR_LEN + total));
    }
    if checksum(icmp) != 0 {
        return Err(PacketError::BadIcmpChecksum);
    }
    let reply = match (icmp[0], icmp[1]) {
        (ICMP_ECHO_REPLY, 0) => true,
        (ICMP_ECHO_REQUEST, 0) => false,
        _ => {
            return Ok(Frame::Other {
                ethertype: ETHERTYPE_IPV4,
                ip_protocol: Some(protocol),
            })
        }
    };
    Ok(Frame::Echo {
        reply,
        src_mac,
        dst_mac,
        src: ip_at(b, 12),
        dst: ip_at(b, 16),
        id: be16(icmp, 4),
        seq: be16(icmp, 6),
        payload: &icmp[ICMP_HDR_LEN..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Mac = [0x52, 0x54, 0, 0, 2, 2];
    const B: Mac = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
    const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
    const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);

    #[test]
    fn checksum_matches_rfc1071_example_and_odd_lengths() {
        // RFC 1071 section 3 example: the sum of these words is 0xddf2, checksum 0x220d.
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0x220d
        );
        // An odd byte counts as the high half of a word.
        assert_eq!(checksum(&[0x01]), !0x0100);
        assert_eq!(checksum(&[]), 0xffff);
    }

    #[test]
    fn ip_header_checksum_matches_a_known_header() {
        // The classic example header (Wikipedia "IPv4 header checksum"): checksum 0xb861.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0xb861);
        h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(checksum(&h), 0);
    }

    #[test]
    fn echo_request_has_the_layout_and_checksums_of_ping() {
        let f = echo(false, A, B, IP_A, IP_B, 0x1234, 7, b"abcdefgh");
        assert_eq!(f.len(), 60, "padded to the Ethernet minimum");
        assert_eq!(&f[0..6], &B);
        assert_eq!(&f[6..12], &A);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        let ip = &f[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(be16(ip, 2), 20 + 8 + 8);
        assert_eq!(ip[9], 1);
        assert_eq!(&ip[12..16], &[10, 0, 2, 2]);
        assert_eq!(&ip[16..20], &[10, 0, 2, 15]);
        assert_eq!(checksum(ip), 0);
        let icmp = &f[34..34 + 16];
        assert_eq!((icmp[0], icmp[1]), (8, 0));
        assert_eq!(checksum(icmp), 0);
        match parse(&f).unwrap() {
            Frame::Echo {
                reply,
                src,
                dst,
                id,
                seq,
                payload,
                ..
            } => {
                assert!(!reply);
                assert_eq!((src, dst, id, seq), (IP_A, IP_B, 0x1234, 7));
                assert_eq!(payload, b"abcdefgh");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn corrupted_frames_are_caught() {
        let good = echo(true, B, A, IP_B, IP_A, 1, 2, &[0x55; 32]);
        assert!(matches!(parse(&good), Ok(Frame::Echo { reply: true, .. })));
        // A flipped payload bit breaks the ICMP checksum.
        let mut bad = good.clone();
        bad[14 + 20 + 8 + 3] ^= 0x10;
        assert_eq!(parse(&bad), Err(PacketError::BadIcmpChecksum));
        // A changed TTL breaks the IP header checksum.
        let mut bad = good.clone();
        bad[14 + 8] -= 1;
        assert_eq!(parse(&bad), Err(PacketError::BadIpChecksum));
        // An IP total length beyond the frame.
        let mut bad = good.clone();
        bad[14 + 2] = 0x40;
        assert!(matches!(parse(&bad), Err(PacketError::BadIpHeader(_))));
        assert_eq!(parse(&good[..10]), Err(PacketError::TooShort(10)));
        assert_eq!(
            parse(&good[..20]),
            Err(PacketError::TooShort(20)),
            "truncated IP header"
        );
    }

    #[test]
    fn arp_round_trips() {
        let req = arp(false, B, IP_B, [0; 6], IP_A);
        assert_eq!(&req[0..6], &BROADCAST);
        assert_eq!(
            parse(&req).unwrap(),
            Frame::Arp {
                reply: false,
                sender_mac: B,
                sender_ip: IP_B,
                target_mac: [0; 6],
                target_ip: IP_A
            }
        );
        let rep = arp(true, A, IP_A, B, IP_B);
        assert_eq!(&rep[0..6], &B);
        assert!(matches!(
            parse(&rep).unwrap(),
            Frame::Arp { reply: true, sender_ip, .. } if sender_ip == IP_A
        ));
        let mut bad = rep;
        bad[14 + 7] = 9;
        assert!(matches!(parse(&bad), Err(PacketError::BadArp(_))));
    }

    #[test]
    fn other_traffic_is_classified_not_rejected() {
        let mut f = echo(false, A, B, IP_A, IP_B, 1, 1, &[]);
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert_eq!(
            parse(&f).unwrap(),
            Frame::Other {
                ethertype: 0x86dd,
                ip_protocol: None
            }
        );
    }
}
