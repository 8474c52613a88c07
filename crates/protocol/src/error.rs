//! Typed errors for encoding and decoding.

use std::borrow::Cow;

use thiserror::Error;

/// Why bytes could not be decoded. Untrusted input only ever yields one of
/// these: never a panic, never an allocation beyond [`crate::limits`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The message is empty.
    #[error("empty message")]
    Empty,
    /// The first byte names no known message kind.
    #[error("unknown message kind {0:#04x}")]
    UnknownKind(u8),
    /// The message is larger than allowed.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Bytes received.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The message ends before a field it needs.
    #[error("truncated: {what} needs {need} bytes, {have} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes that were left.
        have: usize,
    },
    /// Bytes are left over after the message.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A count or value is outside what the protocol allows.
    #[error("field {field}: {value} is not allowed ({allowed})")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The offending value, printed.
        value: String,
        /// What is allowed.
        allowed: Cow<'static, str>,
    },
    /// A delta does not apply to the frames the decoder holds.
    #[error("delta for base tick {want} but the held frame is tick {have:?}")]
    BaseMismatch {
        /// The base tick the delta names.
        want: u64,
        /// The tick of the frame held, if any.
        have: Option<u64>,
    },
    /// The control-message payload is malformed.
    #[error("malformed control message: {0}")]
    Malformed(String),
}

/// Why a message could not be encoded (a caller bug or an over-limit input).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// Column lengths disagree with the boid count.
    #[error("frame columns disagree: {0}")]
    Shape(String),
    /// Ids are not strictly ascending (the implicit order deltas rely on).
    #[error("ids must be strictly ascending; id {id} at index {index} is not")]
    IdsNotAscending {
        /// Index of the first offending id.
        index: usize,
        /// The id.
        id: u32,
    },
    /// A delta's frames do not hold the same boids (send a keyframe).
    #[error("delta frames differ in {0}; a keyframe is needed")]
    NotDeltaCompatible(&'static str),
    /// The message would exceed a protocol limit.
    #[error("{what}: {value} exceeds the limit of {max}")]
    OverLimit {
        /// What is too large.
        what: &'static str,
        /// Its size.
        value: usize,
        /// The limit.
        max: usize,
    },
    /// The control-message serializer failed.
    #[error("serializing a control message: {0}")]
    Serialize(String),
    /// Bytes given as a cell update to put in a batch are not one of its
    /// tick.
    #[error("not a cell update of the batch: {0}")]
    NotAnUpdate(String),
}

impl DecodeError {
    /// The field a value was refused for ([`DecodeError::Invalid`]).
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}
