//! Arbitrary bytes through every wire view (`pfemu::wire`) and the Trio-ML frame parser:
//! after a successful `new_checked` no accessor may panic, whatever the bytes say.
#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use pfemu::microcode::trio_ml::wire::{self as ml, TrioMlHdr, TrioMlHdrFields};
use pfemu::wire::{checksum, checksum_update16, Ether, Ipv4, Tcp, Udp};

fn ether(data: &[u8]) {
    if let Ok(e) = Ether::new_checked(data) {
        black_box((
            e.dmac(),
            e.smac(),
            e.etype(),
            e.as_bytes(),
            e.payload(),
            e.rest(),
        ));
        ipv4(e.payload());
    }
    let mut buf = data.to_vec();
    if let Ok(mut e) = Ether::new_checked(&mut buf[..]) {
        let (d, s, t) = (e.dmac(), e.smac(), e.etype());
        e.set_dmac(s);
        e.set_smac(d);
        e.set_etype(t);
        black_box(e.payload_mut());
        black_box(e.as_bytes_mut());
    }
}

fn ipv4(data: &[u8]) {
    if let Ok(ip) = Ipv4::new_checked(data) {
        // The plain check only guarantees the fixed 20 bytes: ihl, total_len and the
        // checksum may say anything.
        black_box((
            ip.ver(),
            ip.ihl(),
            ip.dscp(),
            ip.ecn(),
            ip.total_len(),
            ip.ident(),
            ip.df(),
            ip.mf(),
            ip.frag_off(),
            ip.ttl(),
            ip.proto(),
            ip.checksum(),
            ip.src(),
            ip.dst(),
        ));
        black_box((ip.src_addr(), ip.dst_addr(), ip.header_len()));
        black_box((ip.options(), ip.payload(), ip.as_bytes(), ip.rest()));
        let computed = ip.compute_checksum();
        let ok = ip.verify_checksum();
        if ok {
            // Equal up to one's-complement zero (0x0000 and 0xFFFF both stand for it).
            let stored = ip.checksum();
            assert!(
                computed == stored || (computed | stored == 0xFFFF && computed & stored == 0),
                "verify_checksum agrees with compute_checksum: {computed:#06x} vs {stored:#06x}"
            );
        }
        let mut buf = data.to_vec();
        let mut ipm = Ipv4::new_checked(&mut buf[..]).expect("same length");
        black_box(ipm.options_mut());
        ipm.fill_checksum();
        if ipm.header_len() >= 20 && ipm.header_len() <= buf.len() {
            let ipm = Ipv4::new_checked(&buf[..]).expect("same length");
            assert!(
                ipm.verify_checksum(),
                "fill_checksum makes a verifiable header"
            );
            // The incremental update of a TTL decrement matches a full recompute.
            let old_word = u16::from_be_bytes([ipm.ttl(), ipm.proto()]);
            let old_sum = ipm.checksum();
            let new_word = u16::from_be_bytes([ipm.ttl().wrapping_sub(1), ipm.proto()]);
            let mut buf2 = buf.clone();
            let mut ip2 = Ipv4::new_checked(&mut buf2[..]).expect("same length");
            ip2.set_ttl(ip2.ttl().wrapping_sub(1));
            ip2.set_checksum(checksum_update16(old_sum, old_word, new_word));
            assert!(
                ip2.verify_checksum(),
                "incremental TTL update stays verifiable"
            );
        }
    }
    if let Ok(ip) = Ipv4::new_checked_full(data) {
        assert_eq!(ip.ver(), 4);
        assert!(ip.header_len() >= 20 && ip.header_len() <= data.len());
        black_box((ip.options(), ip.payload(), ip.verify_checksum()));
        let payload = ip.payload();
        match ip.proto() {
            pfemu::wire::IPPROTO_UDP => udp(payload),
            pfemu::wire::IPPROTO_TCP => tcp(payload),
            _ => {}
        }
    }
}

fn udp(data: &[u8]) {
    if let Ok(u) = Udp::new_checked(data) {
        black_box((
            u.src_port(),
            u.dst_port(),
            u.len(),
            u.checksum(),
            u.payload(),
            u.rest(),
        ));
    }
}

fn tcp(data: &[u8]) {
    if let Ok(t) = Tcp::new_checked(data) {
        black_box((
            t.src_port(),
            t.dst_port(),
            t.seq(),
            t.ack(),
            t.data_off(),
            t.flags(),
            t.window(),
            t.checksum(),
            t.urgent(),
            t.header_len(),
            t.rest(),
        ));
    }
}

fn trio_ml(data: &[u8]) {
    if let Ok(h) = TrioMlHdr::new_checked(data) {
        let fields = TrioMlHdrFields::read(&h);
        let mut buf = h.as_bytes().to_vec();
        fields.write(&mut TrioMlHdr::new_unchecked(&mut buf[..]));
        black_box(&buf);
    }
    if let Ok((hdr, grads)) = ml::parse(data) {
        black_box((format!("{hdr:?}"), ml::gradients(grads)));
    }
}

fuzz_target!(|data: &[u8]| {
    black_box(checksum(data));
    ether(data);
    ipv4(data);
    udp(data);
    tcp(data);
    trio_ml(data);
});
