//! The Redis Cluster hash slot of a key, as the servers compute it (`CLUSTER KEYSLOT`): calls are
//! routed by it (`cluster.rs`), and the store checks with it that one call's keys share a slot.

/// Slots in a Redis Cluster.
pub const SLOTS: usize = 16_384;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (a non-empty `{…}`: its
/// first `{` and the first `}` after it) when it has one, else of the whole key, modulo 16,384.
#[must_use]
pub fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter().position(|&b| b == b'}').filter(|&close| close > 0).map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc = (crc << 8) ^ CRC16[usize::from(((crc >> 8) ^ u16::from(byte)) & 0xff)];
    }
    crc % 16_384
}

/// CRC16/XMODEM (polynomial 0x1021) of every byte, computed at compile time (where `From` cannot
/// be called: the casts below are of values below 256).
#[allow(clippy::cast_possible_truncation)]
const CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // Redis's own answers (CLUSTER KEYSLOT); the store's cluster tests compare many more.
        assert_eq!(slot(b"123456789"), 0x31C3, "CRC16/XMODEM's check value");
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"), "an empty tag hashes the whole key");
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b""), 0);
    }
}
