//! starling-protocol: the contract between the Starling server and every
//! client. PROTOCOL.md at the repository root describes every byte; this
//! crate is the reference implementation.
//!
//! # Layout
//! - `messages.rs`: control messages both ways (hello, commands, acks,
//!   errors, agents, metrics, close), plain serde types.
//! - `codec.rs`: the envelope (a kind byte) and the bincode codec for
//!   control messages: the only file that names bincode.
//! - `frame/`: snapshots. A keyframe is a small header, the ids as runs,
//!   then struct-of-arrays blocks of quantised positions (`u16` x, y, z)
//!   and octahedral headings (2 bytes), ready to upload as vertex data. A
//!   delta predicts each boid from the two frames before it and sends
//!   `i8` residuals, with exceptions for boids that moved unexpectedly.
//!   `mod.rs` holds the shared [`Frame`], [`FrameBuilder`] and header
//!   constants; `keyframe.rs` and `delta.rs` encode, `reader.rs` decodes.
//! - `interest/`: the interest stream (1.2): a grid of cells, cell
//!   updates (boids that left, entered, and a delta for those that
//!   stayed), summaries, per-viewer batches, and the receiving mirror.
//! - `quant.rs`: the quantisation of positions and headings.
//! - `limits.rs`: every bound the decoders enforce; `error.rs`: typed errors.
//!
//! Decoders take untrusted bytes: they never panic and never allocate
//! beyond [`limits`]; every failure is a [`DecodeError`].
//!
//! # Example
//! ```
//! use starling_protocol::{Frame, QuantBox, ServerFrame, decode_server, encode_keyframe};
//!
//! let frame = Frame {
//!     tick: 7,
//!     quant: Some(QuantBox::around_world([100.0, 100.0, 50.0], 3)),
//!     ids: vec![0, 1],
//!     pos: vec![0, 0, 0, 65535, 65535, 65535],
//!     heading: vec![255, 128, 0, 128],
//! };
//! let mut bytes = Vec::new();
//! encode_keyframe(&frame, &mut bytes).unwrap();
//! let ServerFrame::Keyframe(view) = decode_server(&bytes).unwrap() else { unreachable!() };
//! let mut back = Frame::default();
//! view.to_frame(&mut back);
//! assert_eq!(back, frame);
//! ```

mod codec;
mod error;
mod frame;
pub mod golden;
pub mod interest;
pub mod limits;
mod messages;
mod quant;

pub use codec::{
    KIND_CLIENT_CONTROL, KIND_SERVER_CONTROL, ServerFrame, command_request_id, declared_major,
    decode_client, decode_server, encode_client, encode_server, is_flock_message,
};
pub use error::{DecodeError, EncodeError};
pub use frame::{
    DELTA_HEADER_BYTES, DeltaView, EXCEPTION_BYTES, Frame, FrameBuilder, KEYFRAME_HEADER_BYTES,
    KIND_DELTA, KIND_KEYFRAME, KeyframeView, RESIDUAL_ESCAPE, encode_delta, encode_keyframe,
};
pub use messages::*;
pub use quant::{
    Lanes3, OCT_PLUS_X, Q_MAX, QUANT_LANES, QUANT_MARGIN, QuantBox, oct_decode, oct_encode,
};
