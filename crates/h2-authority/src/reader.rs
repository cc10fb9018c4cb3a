//! The client-to-server direction: frames pass, header blocks are rewritten.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use loona_hpack::Decoder;
use tokio::io::{AsyncRead, ReadBuf};

use crate::Config;
use crate::frame::{
    self, CONTINUATION, DEFAULT_HEADER_TABLE_SIZE, DEFAULT_MAX_FRAME_SIZE, END_HEADERS, END_STREAM,
    HEAD_LEN, HEADERS, Head, MAX_MAX_FRAME_SIZE, PADDED, PREFACE, PRIORITY, SETTINGS,
};
use crate::settings::Observer;

/// How much to ask of the connection at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Slack over the header list limit for an encoded block: an encoded block is at most
/// about as large as the list it decodes to, unless it is hostile.
const BLOCK_SLACK: usize = 1024;
/// Size of a literal field's accounting overhead (RFC 9113 6.5.2).
const FIELD_OVERHEAD: usize = 32;

/// Why the adapter gave up on a connection. The server sees it as a read error
/// ([`io::ErrorKind::InvalidData`]); no message carries a header's value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RewriteError {
    /// Another frame arrived while a header block awaited its CONTINUATION.
    #[error(
        "a {kind} frame on stream {stream} arrived while the header block of stream {expected} awaited CONTINUATION"
    )]
    ContinuationExpected {
        /// The frame's type.
        kind: &'static str,
        /// The frame's stream.
        stream: u32,
        /// The stream whose header block is unfinished.
        expected: u32,
    },
    /// More CONTINUATION frames in one header block than any real client sends (empty ones
    /// cost nothing to send and grow no buffer: the CONTINUATION flood).
    #[error("header block of stream {stream} has more than {max} CONTINUATION frames")]
    TooManyContinuations {
        /// The stream.
        stream: u32,
        /// The limit.
        max: usize,
    },
    /// A CONTINUATION frame without a header block in progress.
    #[error("CONTINUATION frame on stream {stream} without a header block in progress")]
    UnexpectedContinuation {
        /// The frame's stream.
        stream: u32,
    },
    /// A header frame larger than the server's SETTINGS_MAX_FRAME_SIZE.
    #[error("{kind} frame of {len} bytes exceeds the server's maximum frame size of {max} bytes")]
    FrameTooLarge {
        /// The frame's type.
        kind: &'static str,
        /// Its payload length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// HEADERS on stream 0, or whose padding or priority does not fit the frame.
    #[error("malformed HEADERS frame on stream {stream}: {reason}")]
    MalformedHeaders {
        /// The frame's stream.
        stream: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// The encoded header block is larger than the server would ever accept.
    #[error("header block of stream {stream} exceeds {limit} bytes")]
    BlockTooLarge {
        /// The stream.
        stream: u32,
        /// The limit.
        limit: usize,
    },
    /// The decoded header list exceeds the server's SETTINGS_MAX_HEADER_LIST_SIZE.
    #[error("header list of stream {stream} exceeds the server's limit of {limit} bytes")]
    HeaderListTooLarge {
        /// The stream.
        stream: u32,
        /// The limit.
        limit: usize,
    },
    /// The header block is not valid HPACK.
    #[error("invalid HPACK in the header block of stream {stream}: {reason}")]
    Hpack {
        /// The stream.
        stream: u32,
        /// The decoder's complaint (never a header's value).
        reason: String,
    },
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Matching the client preface; `0..24` bytes of it seen.
    Preface(usize),
    /// Expecting a frame header.
    Head,
    /// Copying `remaining` bytes of a frame's payload through.
    Pass(usize),
    /// Waiting for the whole payload of a HEADERS or CONTINUATION frame.
    Payload(Head),
    /// Not HTTP/2 with prior knowledge: everything passes, the server decides.
    Raw,
}

/// A header block being collected from HEADERS and CONTINUATION frames.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: BytesMut,
    /// CONTINUATION frames so far.
    continuations: usize,
}

/// Most CONTINUATION frames one header block may have: a block is at most the header list
/// limit + 1 KiB, which at the smallest frame size (16 KiB) is a handful of frames.
pub(crate) const MAX_CONTINUATIONS: usize = 32;

/// The limits in force for client frames: the protocol's defaults, then the server's
/// SETTINGS once the client has acknowledged them.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_frame_size: u32,
    max_header_list_size: usize,
}

/// What the connection's header blocks become, decided by its first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No header block yet.
    Decide,
    /// The first request carried the authority already: its block and every frame after it
    /// pass untouched (the server's HPACK state stays the client's), decoded no more.
    Pass,
    /// Every header block is decoded and re-encoded as literals, `:authority` replaced.
    Rewrite,
}

pub(crate) struct Reader {
    authority: Bytes,
    mode: Mode,
    state: State,
    limits: Limits,
    decoder: Decoder<'static>,
    block: Option<Block>,
    /// Bytes read from the client, not yet processed.
    input: BytesMut,
    /// Processed bytes, ready for the server.
    output: BytesMut,
    eof: bool,
    failed: Option<RewriteError>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("state", &self.state)
            .field("limits", &self.limits)
            .field("input", &self.input.len())
            .field("output", &self.output.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Reader {
    pub(crate) fn new(config: &Config) -> Self {
        let mut decoder = Decoder::new();
        // Without this the decoder would follow any table size update a client sends.
        decoder.set_max_allowed_table_size(DEFAULT_HEADER_TABLE_SIZE as usize);
        Self {
            authority: config.authority.clone(),
            mode: Mode::Decide,
            state: State::Preface(0),
            limits: Limits {
                max_frame_size: DEFAULT_MAX_FRAME_SIZE,
                max_header_list_size: config.max_header_list_size as usize,
            },
            decoder,
            block: None,
            input: BytesMut::new(),
            output: BytesMut::new(),
            eof: false,
            failed: None,
        }
    }

    pub(crate) fn poll_read<IO: AsyncRead + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        io: &mut IO,
        observer: &mut Observer,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !self.output.is_empty() {
                let n = self.output.len().min(buf.remaining());
                buf.put_slice(&self.output[..n]);
                self.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if let Some(error) = &self.failed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    error.clone(),
                )));
            }
            if self.eof {
                return Poll::Ready(Ok(()));
            }
            // Raw (a connection that passes, or not HTTP/2) with nothing buffered: the
            // client's bytes go straight to the server's buffer.
            if matches!(self.state, State::Raw) && self.input.is_empty() {
                return Pin::new(&mut *io).poll_read(cx, buf);
            }
            let start = self.input.len();
            let want = match self.state {
                State::Payload(head) => (head.len + HEAD_LEN).saturating_sub(start).max(READ_CHUNK),
                _ => READ_CHUNK,
            };
            self.input.resize(start + want, 0);
            let mut read = ReadBuf::new(&mut self.input[start..]);
            let polled = Pin::new(&mut *io).poll_read(cx, &mut read);
            let filled = read.filled().len();
            self.input.truncate(start + filled);
            match polled {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if filled == 0 => self.eof = true,
                Poll::Ready(Ok(())) => {
                    if let Err(error) = self.process(observer) {
                        tracing::warn!(%error, "closing an HTTP/2 connection: malformed client frames");
                        self.input.clear();
                        self.block = None;
                        self.failed = Some(error);
                    }
                }
            }
        }
    }

    /// Moves what `input` holds to `output`, as far as whole units allow.
    fn process(&mut self, observer: &mut Observer) -> Result<(), RewriteError> {
        loop {
            match self.state {
                State::Raw => {
                    let all = self.input.split();
                    self.output.unsplit(all);
                    return Ok(());
                }
                State::Preface(seen) => {
                    let n = (PREFACE.len() - seen).min(self.input.len());
                    if n == 0 {
                        return Ok(());
                    }
                    if self.input[..n] != PREFACE[seen..seen + n] {
                        self.state = State::Raw;
                        continue;
                    }
                    self.pass(n);
                    self.state = if seen + n == PREFACE.len() {
                        State::Head
                    } else {
                        State::Preface(seen + n)
                    };
                }
                State::Pass(remaining) => {
                    if remaining == 0 {
                        self.state = State::Head;
                        continue;
                    }
                    let n = remaining.min(self.input.len());
                    if n == 0 {
                        return Ok(());
                    }
                    self.pass(n);
                    self.state = State::Pass(remaining - n);
                }
                State::Head => {
                    if !self.frame_head(observer)? {
                        return Ok(());
                    }
                }
                State::Payload(head) => {
                    if self.input.len() < HEAD_LEN + head.len {
                        return Ok(());
                    }
                    self.input.advance(HEAD_LEN);
                    let payload = self.input.split_to(head.len);
                    self.header_frame(head, &payload)?;
                    // A connection that passes needs no frame read again: raw from here.
                    self.state = if self.mode == Mode::Pass {
                        State::Raw
                    } else {
                        State::Head
                    };
                }
            }
        }
    }

    /// Reads a frame head: a header block's frames are rewritten (their payload is read
    /// next), a SETTINGS ACK applies the settings it acknowledges, other frames pass.
    /// `false`: the head has not arrived whole yet.
    fn frame_head(&mut self, observer: &mut Observer) -> Result<bool, RewriteError> {
        let Some(bytes) = self.input.first_chunk::<HEAD_LEN>() else {
            return Ok(false);
        };
        let head = Head::parse(bytes);
        if let Some(block) = &self.block
            && head.kind != CONTINUATION
        {
            return Err(RewriteError::ContinuationExpected {
                kind: frame::kind_name(head.kind),
                stream: head.stream,
                expected: block.stream,
            });
        }
        match head.kind {
            HEADERS | CONTINUATION if self.mode != Mode::Pass => {
                if head.len > self.limits.max_frame_size as usize {
                    return Err(RewriteError::FrameTooLarge {
                        kind: frame::kind_name(head.kind),
                        len: head.len,
                        max: self.limits.max_frame_size,
                    });
                }
                self.state = State::Payload(head);
            }
            SETTINGS => {
                if head.flags & frame::ACK != 0
                    && head.stream == 0
                    && let Some(parameters) = observer.acknowledged()
                {
                    self.apply(&parameters);
                }
                self.pass(HEAD_LEN);
                self.state = State::Pass(head.len);
            }
            _ => {
                self.pass(HEAD_LEN);
                self.state = State::Pass(head.len);
            }
        }
        Ok(true)
    }

    fn pass(&mut self, n: usize) {
        let bytes = self.input.split_to(n);
        self.output.unsplit(bytes);
    }

    fn apply(&mut self, parameters: &[(u16, u32)]) {
        for &(id, value) in parameters {
            match id {
                frame::SETTINGS_HEADER_TABLE_SIZE => {
                    self.decoder.set_max_allowed_table_size(value as usize);
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    self.limits.max_frame_size =
                        value.clamp(DEFAULT_MAX_FRAME_SIZE, MAX_MAX_FRAME_SIZE);
                }
                frame::SETTINGS_MAX_HEADER_LIST_SIZE => {
                    self.limits.max_header_list_size = value as usize;
                }
                _ => {}
            }
        }
    }

    fn block_limit(&self) -> usize {
        self.limits.max_header_list_size.saturating_add(BLOCK_SLACK)
    }

    fn header_frame(&mut self, head: Head, payload: &[u8]) -> Result<(), RewriteError> {
        let malformed = |reason| RewriteError::MalformedHeaders {
            stream: head.stream,
            reason,
        };
        let fragment = if head.kind == HEADERS {
            if head.stream == 0 {
                return Err(malformed("stream 0"));
            }
            let mut rest = payload;
            let padding = if head.flags & PADDED != 0 {
                let (&n, tail) = rest
                    .split_first()
                    .ok_or(malformed("no room for the pad length"))?;
                rest = tail;
                usize::from(n)
            } else {
                0
            };
            let priority = if head.flags & PRIORITY != 0 {
                let (fields, tail) = rest
                    .split_first_chunk::<5>()
                    .ok_or(malformed("no room for the priority fields"))?;
                rest = tail;
                Some(*fields)
            } else {
                None
            };
            let end = rest
                .len()
                .checked_sub(padding)
                .ok_or(malformed("padding longer than the frame"))?;
            self.block = Some(Block {
                stream: head.stream,
                end_stream: head.flags & END_STREAM != 0,
                priority,
                fragment: BytesMut::new(),
                continuations: 0,
            });
            &rest[..end]
        } else {
            let Some(block) = &mut self.block else {
                return Err(RewriteError::UnexpectedContinuation {
                    stream: head.stream,
                });
            };
            block.continuations += 1;
            if block.continuations > MAX_CONTINUATIONS {
                return Err(RewriteError::TooManyContinuations {
                    stream: block.stream,
                    max: MAX_CONTINUATIONS,
                });
            }
            if block.stream != head.stream {
                return Err(RewriteError::ContinuationExpected {
                    kind: "CONTINUATION",
                    stream: head.stream,
                    expected: block.stream,
                });
            }
            payload
        };
        let limit = self.block_limit();
        let Some(block) = &mut self.block else {
            return Ok(());
        };
        if block.fragment.len() + fragment.len() > limit {
            return Err(RewriteError::BlockTooLarge {
                stream: block.stream,
                limit,
            });
        }
        block.fragment.extend_from_slice(fragment);
        if head.flags & END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.rewrite(block)?;
        }
        Ok(())
    }

    /// Decodes a whole header block and writes it out again as literals, `:authority`
    /// replaced, in frames the server accepts; or, for a connection's first block when it is
    /// a request already carrying the authority (drivers since v1.6, the sync controller),
    /// writes it as it came and lets every later frame pass untouched.
    fn rewrite(&mut self, block: Block) -> Result<(), RewriteError> {
        let limit = self.limits.max_header_list_size;
        let authority = &self.authority;
        let mut encoded = Vec::with_capacity(block.fragment.len() + authority.len() + 16);
        let mut list_size = 0usize;
        let mut over = false;
        let mut request = false;
        let mut authority_written = false;
        let mut in_pseudo = true;
        let mut authorities = 0usize;
        let mut authority_is_ours = false;
        let decoded = self.decoder.decode_with_cb(&block.fragment, |name, value| {
            if over {
                return;
            }
            list_size = list_size.saturating_add(name.len() + value.len() + FIELD_OVERHEAD);
            if list_size > limit {
                // Decoding goes on (it must, to keep the dynamic table in step, and it
                // costs no memory), but nothing more is kept.
                over = true;
                return;
            }
            let pseudo = name.first() == Some(&b':');
            if !pseudo && in_pseudo {
                in_pseudo = false;
                if request && !authority_written {
                    literal(&mut encoded, b":authority", authority);
                    authority_written = true;
                }
            }
            if &*name == b":method" {
                request = true;
            }
            if &*name == b":authority" {
                authorities += 1;
                authority_is_ours = *value == authority[..];
                literal(&mut encoded, &name, authority);
                authority_written = true;
            } else {
                literal(&mut encoded, &name, &value);
            }
        });
        if let Err(error) = decoded {
            return Err(RewriteError::Hpack {
                stream: block.stream,
                reason: error.to_string(),
            });
        }
        if over {
            return Err(RewriteError::HeaderListTooLarge {
                stream: block.stream,
                limit,
            });
        }
        if self.mode == Mode::Decide {
            // Once a block is re-encoded (its fields kept out of the server's dynamic table)
            // the client's and the server's tables differ: the decision is for good.
            self.mode = if request && authorities == 1 && authority_is_ours {
                Mode::Pass
            } else {
                Mode::Rewrite
            };
        }
        if self.mode == Mode::Pass {
            self.frames(&block, &block.fragment);
            return Ok(());
        }
        if request && !authority_written {
            literal(&mut encoded, b":authority", authority);
        }
        self.frames(&block, &encoded);
        Ok(())
    }

    /// Writes `encoded` as one HEADERS frame and as many CONTINUATION frames as the
    /// server's maximum frame size needs.
    fn frames(&mut self, block: &Block, encoded: &[u8]) {
        let max = self.limits.max_frame_size as usize;
        let priority_len = if block.priority.is_some() { 5 } else { 0 };
        let first = encoded.len().min(max - priority_len);
        let (head_part, mut rest) = encoded.split_at(first);
        let mut flags = if block.end_stream { END_STREAM } else { 0 };
        if block.priority.is_some() {
            flags |= PRIORITY;
        }
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        self.output
            .reserve(encoded.len() + HEAD_LEN * (1 + encoded.len() / max) + 5);
        Head {
            len: priority_len + head_part.len(),
            kind: HEADERS,
            flags,
            stream: block.stream,
        }
        .write(&mut self.output);
        if let Some(priority) = block.priority {
            self.output.extend_from_slice(&priority);
        }
        self.output.extend_from_slice(head_part);
        while !rest.is_empty() {
            let (part, tail) = rest.split_at(rest.len().min(max));
            rest = tail;
            Head {
                len: part.len(),
                kind: CONTINUATION,
                flags: if rest.is_empty() { END_HEADERS } else { 0 },
                stream: block.stream,
            }
            .write(&mut self.output);
            self.output.extend_from_slice(part);
        }
    }
}

/// A literal header field without indexing, with a literal name (RFC 7541 6.2.2): it
/// leaves the server's dynamic table alone, so the server's HPACK state never depends on
/// the client's.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    string(out, name);
    string(out, value);
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    // Writing into a Vec cannot fail.
    let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
    out.extend_from_slice(s);
}
