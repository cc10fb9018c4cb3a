//! The few HTTP/2 framing facts the adapter needs (RFC 9113 section 4 and 6).

/// What a client sends first (RFC 9113 3.4).
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of a frame header.
pub(crate) const HEAD_LEN: usize = 9;

pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const CONTINUATION: u8 = 0x9;

pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
pub(crate) const PRIORITY: u8 = 0x20;

pub(crate) const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub(crate) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub(crate) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// The protocol's defaults, in force until the server's SETTINGS are acknowledged.
pub(crate) const DEFAULT_HEADER_TABLE_SIZE: u32 = 4096;
pub(crate) const DEFAULT_MAX_FRAME_SIZE: u32 = 16_384;
/// The largest SETTINGS_MAX_FRAME_SIZE a peer may advertise.
pub(crate) const MAX_MAX_FRAME_SIZE: u32 = (1 << 24) - 1;

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) len: usize,
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) stream: u32,
}

impl Head {
    pub(crate) fn parse(bytes: &[u8; HEAD_LEN]) -> Self {
        Self {
            len: (usize::from(bytes[0]) << 16)
                | (usize::from(bytes[1]) << 8)
                | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }

    /// Appends this header to `out`; `len` must fit in 24 bits.
    pub(crate) fn write(&self, out: &mut bytes::BytesMut) {
        let len = u32::try_from(self.len)
            .unwrap_or(MAX_MAX_FRAME_SIZE)
            .min(MAX_MAX_FRAME_SIZE);
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.extend_from_slice(&[self.kind, self.flags]);
        out.extend_from_slice(&(self.stream & 0x7fff_ffff).to_be_bytes());
    }
}

/// A frame type's name, for error messages.
pub(crate) fn kind_name(kind: u8) -> &'static str {
    match kind {
        0x0 => "DATA",
        HEADERS => "HEADERS",
        0x2 => "PRIORITY",
        0x3 => "RST_STREAM",
        SETTINGS => "SETTINGS",
        0x5 => "PUSH_PROMISE",
        0x6 => "PING",
        0x7 => "GOAWAY",
        0x8 => "WINDOW_UPDATE",
        CONTINUATION => "CONTINUATION",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_round_trip() {
        let head = Head {
            len: 0x01_02_03,
            kind: HEADERS,
            flags: END_HEADERS | END_STREAM,
            stream: 0x7fff_fffd,
        };
        let mut out = bytes::BytesMut::new();
        head.write(&mut out);
        let bytes: [u8; HEAD_LEN] = out[..].try_into().unwrap();
        assert_eq!(Head::parse(&bytes), head);
    }

    #[test]
    fn the_reserved_bit_is_ignored() {
        let bytes = [0, 0, 4, SETTINGS, 0, 0x80, 0, 0, 1];
        assert_eq!(Head::parse(&bytes).stream, 1);
    }
}
