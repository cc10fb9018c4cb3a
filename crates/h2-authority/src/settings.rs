//! The server's SETTINGS, read from the bytes it writes to the client.
//!
//! A setting the server advertises governs what the client may send only once the client
//! has acknowledged it (RFC 9113 6.5.3), and the server applies it at that point too. So
//! each SETTINGS frame the server writes is queued here, and the reader applies the oldest
//! queued frame when it passes the client's SETTINGS ACK: both sides then agree on the
//! limits for every later frame.

use std::collections::VecDeque;

use crate::frame::{ACK, HEAD_LEN, Head, SETTINGS};

/// More unacknowledged SETTINGS frames than a sane server ever has outstanding; beyond
/// it the oldest are dropped (a server is trusted, but memory stays bounded).
const MAX_PENDING: usize = 16;
/// Every defined setting fits many times over; the rest of a larger frame is ignored.
const MAX_SETTINGS_PAYLOAD: usize = 6 * 32;

/// One SETTINGS frame's parameters, in order.
pub(crate) type Parameters = Vec<(u16, u32)>;

/// Follows the server-to-client frame sequence without changing it.
#[derive(Debug, Default)]
pub(crate) struct Observer {
    head: [u8; HEAD_LEN],
    head_len: usize,
    /// Payload bytes of the current frame still to pass.
    remaining: usize,
    /// The payload of a SETTINGS frame being collected.
    settings: Option<Vec<u8>>,
    pending: VecDeque<Parameters>,
}

impl Observer {
    /// Reads `bytes`, the next bytes the server wrote.
    pub(crate) fn observe(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(bytes.len());
                if let Some(payload) = &mut self.settings {
                    let room = MAX_SETTINGS_PAYLOAD.saturating_sub(payload.len());
                    payload.extend_from_slice(&bytes[..n.min(room)]);
                }
                bytes = &bytes[n..];
                self.remaining -= n;
                if self.remaining == 0 {
                    self.finish_frame();
                }
                continue;
            }
            let n = (HEAD_LEN - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
            self.head_len += n;
            bytes = &bytes[n..];
            if self.head_len == HEAD_LEN {
                self.head_len = 0;
                let head = Head::parse(&self.head);
                self.remaining = head.len;
                if head.kind == SETTINGS && head.flags & ACK == 0 && head.stream == 0 {
                    self.settings = Some(Vec::with_capacity(head.len.min(MAX_SETTINGS_PAYLOAD)));
                }
                if self.remaining == 0 {
                    self.finish_frame();
                }
            }
        }
    }

    fn finish_frame(&mut self) {
        let Some(payload) = self.settings.take() else {
            return;
        };
        let parameters = payload
            .chunks_exact(6)
            .map(|p| {
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
                )
            })
            .collect();
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back(parameters);
    }

    /// The oldest SETTINGS the client has not acknowledged yet, taken because it just did.
    pub(crate) fn acknowledged(&mut self) -> Option<Parameters> {
        self.pending.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_frame(parameters: &[(u16, u32)]) -> Vec<u8> {
        let mut frame = Vec::new();
        let len = parameters.len() * 6;
        frame.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        frame.extend_from_slice(&[SETTINGS, 0, 0, 0, 0, 0]);
        for (id, value) in parameters {
            frame.extend_from_slice(&id.to_be_bytes());
            frame.extend_from_slice(&value.to_be_bytes());
        }
        frame
    }

    #[test]
    fn settings_are_found_whatever_the_write_boundaries() {
        let mut stream = settings_frame(&[(5, 32_768), (6, 8192)]);
        // A PING and a SETTINGS ACK after it must not be taken for settings.
        stream.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        stream.extend_from_slice(&[0, 0, 0, SETTINGS, ACK, 0, 0, 0, 0]);
        stream.extend(settings_frame(&[(1, 0)]));
        for chunk in [1, 2, 5, 9, 13, stream.len()] {
            let mut observer = Observer::default();
            for piece in stream.chunks(chunk) {
                observer.observe(piece);
            }
            assert_eq!(
                observer.acknowledged(),
                Some(vec![(5, 32_768), (6, 8192)]),
                "{chunk}"
            );
            assert_eq!(observer.acknowledged(), Some(vec![(1, 0)]), "{chunk}");
            assert_eq!(observer.acknowledged(), None, "{chunk}");
        }
    }

    #[test]
    fn an_empty_settings_frame_is_queued_too() {
        let mut observer = Observer::default();
        observer.observe(&settings_frame(&[]));
        assert_eq!(observer.acknowledged(), Some(vec![]));
    }
}
