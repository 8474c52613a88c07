//! The envelope and the control-message codec: the only file that knows
//! bincode, so a wire-compatible replacement is a one-file change.
//!
//! Every WebSocket binary message starts with a kind byte:
//! [`KIND_SERVER_CONTROL`] or [`KIND_CLIENT_CONTROL`] followed by a
//! bincode body, or a snapshot ([`KIND_KEYFRAME`], [`KIND_DELTA`], laid
//! out in `frame/`). The bincode configuration is fixed-width little-
//! endian integers (`u32` enum tags, `u64` lengths), so PROTOCOL.md can
//! describe every byte.

use bincode::config::{Configuration, Fixint, Limit, LittleEndian};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{DecodeError, EncodeError};
use crate::frame::{DeltaView, KIND_DELTA, KIND_KEYFRAME, KeyframeView, at_most};
use crate::interest::{KIND_CELLS, KIND_COMPACT_CELLS};
use crate::limits::{
    MAX_AGENTS, MAX_CONTROL_BYTES, MAX_MESSAGE_BYTES, MAX_PARAMS, MAX_STRING_BYTES, MAX_WAYPOINTS,
};
use crate::messages::{ClientMsg, Command, ServerMsg};

/// First byte of a server control message.
pub const KIND_SERVER_CONTROL: u8 = 0x01;
/// First byte of a client control message.
pub const KIND_CLIENT_CONTROL: u8 = 0x02;

type Config = Configuration<LittleEndian, Fixint, Limit<MAX_CONTROL_BYTES>>;

fn config() -> Config {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<MAX_CONTROL_BYTES>()
}

/// A decoded server message: a control message, or a snapshot view that
/// borrows the bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerFrame<'a> {
    /// Hello, params, agents, metrics, acks, errors, pong, close.
    Control(ServerMsg),
    /// A keyframe snapshot.
    Keyframe(KeyframeView<'a>),
    /// A delta snapshot.
    Delta(DeltaView<'a>),
    /// A cell batch of the interest stream (1.2; compact, 1.7), checked when a
    /// [`crate::interest::CellMirror`] applies it (which knows the grid).
    Cells(&'a [u8]),
}

fn encode_control(kind: u8, msg: &impl Serialize, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    out.clear();
    out.push(kind);
    bincode::serde::encode_into_std_write(msg, out, config())
        .map_err(|e| EncodeError::Serialize(e.to_string()))?;
    if out.len() > MAX_CONTROL_BYTES + 1 {
        return Err(EncodeError::OverLimit {
            what: "control message bytes",
            value: out.len(),
            max: MAX_CONTROL_BYTES + 1,
        });
    }
    Ok(())
}

fn decode_control<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    if body.len() > MAX_CONTROL_BYTES {
        return Err(DecodeError::TooLarge {
            len: body.len(),
            max: MAX_CONTROL_BYTES,
        });
    }
    let (msg, used) = bincode::serde::decode_from_slice::<T, _>(body, config())
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(DecodeError::TrailingBytes(body.len() - used));
    }
    Ok(msg)
}

fn split(bytes: &[u8]) -> Result<(u8, &[u8]), DecodeError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: MAX_MESSAGE_BYTES,
        });
    }
    bytes
        .split_first()
        .map(|(k, body)| (*k, body))
        .ok_or(DecodeError::Empty)
}

/// Encodes a server control message into `out` (cleared first).
pub fn encode_server(msg: &ServerMsg, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    encode_control(KIND_SERVER_CONTROL, msg, out)
}

/// Encodes a client message into `out` (cleared first).
pub fn encode_client(msg: &ClientMsg, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    encode_control(KIND_CLIENT_CONTROL, msg, out)
}

/// Decodes anything a server sends.
pub fn decode_server(bytes: &[u8]) -> Result<ServerFrame<'_>, DecodeError> {
    let (kind, body) = split(bytes)?;
    match kind {
        KIND_SERVER_CONTROL => {
            let msg: ServerMsg = decode_control(body)?;
            check_server(&msg)?;
            Ok(ServerFrame::Control(msg))
        }
        KIND_KEYFRAME => KeyframeView::parse(bytes).map(ServerFrame::Keyframe),
        KIND_DELTA => DeltaView::parse(bytes).map(ServerFrame::Delta),
        KIND_CELLS | KIND_COMPACT_CELLS => Ok(ServerFrame::Cells(bytes)),
        other => Err(DecodeError::UnknownKind(other)),
    }
}

/// Whether a server message whose first byte is `kind` carries the flock:
/// a keyframe, a delta or a cell batch of either layout, what
/// [`decode_server`] returns as a frame or cells. A viewer dropping its
/// backlog skips these unread; control messages it always reads.
pub fn is_flock_message(kind: u8) -> bool {
    matches!(
        kind,
        KIND_KEYFRAME | KIND_DELTA | KIND_CELLS | KIND_COMPACT_CELLS
    )
}

/// Decodes anything a client sends.
pub fn decode_client(bytes: &[u8]) -> Result<ClientMsg, DecodeError> {
    let (kind, body) = split(bytes)?;
    if kind != KIND_CLIENT_CONTROL {
        return Err(DecodeError::UnknownKind(kind));
    }
    let msg: ClientMsg = decode_control(body)?;
    check_client(&msg)?;
    Ok(msg)
}

/// The request id of a client message that is a `Command`, read without
/// the limits [`decode_client`] checks: a command refused for breaking one
/// is answered under its id (None for any other message, or bytes that do
/// not decode at all).
pub fn command_request_id(bytes: &[u8]) -> Option<u32> {
    let (kind, body) = split(bytes).ok()?;
    if kind != KIND_CLIENT_CONTROL {
        return None;
    }
    match decode_control::<ClientMsg>(body).ok()? {
        ClientMsg::Command { request_id, .. } => Some(request_id),
        _ => None,
    }
}

/// The protocol major version a message declares, read from the bytes that
/// stay put across versions (kind, tag 0 = `Hello`/`Subscribe`, then the
/// `u16` major): lets each side say "version mismatch" rather than
/// "malformed" when the rest does not decode.
pub fn declared_major(bytes: &[u8]) -> Option<u16> {
    match bytes {
        [
            KIND_SERVER_CONTROL | KIND_CLIENT_CONTROL,
            0,
            0,
            0,
            0,
            lo,
            hi,
            ..,
        ] => Some(u16::from_le_bytes([*lo, *hi])),
        _ => None,
    }
}

fn limit(field: &'static str, len: usize, max: usize) -> Result<(), DecodeError> {
    if len > max {
        return Err(DecodeError::Invalid {
            field,
            value: len.to_string(),
            allowed: at_most(max).into(),
        });
    }
    Ok(())
}

fn check_server(msg: &ServerMsg) -> Result<(), DecodeError> {
    match msg {
        ServerMsg::Hello(h) => {
            limit("server", h.server.len(), MAX_STRING_BYTES)?;
            limit("params", h.params.len(), MAX_PARAMS)?;
            for p in &h.params {
                limit("param name", p.name.len(), MAX_STRING_BYTES)?;
                limit("param choices", p.choices.len(), MAX_PARAMS)?;
            }
        }
        ServerMsg::Params(ps) => limit("params", ps.len(), MAX_PARAMS)?,
        ServerMsg::Agents(a) => {
            limit("predators", a.predators.len(), MAX_AGENTS)?;
            limit("goals", a.goals.len(), MAX_AGENTS)?;
            limit("obstacles", a.obstacles.len(), MAX_AGENTS)?;
            for g in &a.goals {
                limit("waypoints", g.waypoints.len(), MAX_WAYPOINTS)?;
            }
        }
        ServerMsg::Error(e) => {
            limit("detail", e.detail.len(), MAX_STRING_BYTES)?;
            limit(
                "field",
                e.field.as_ref().map_or(0, String::len),
                MAX_STRING_BYTES,
            )?;
        }
        ServerMsg::Close(c) => limit("detail", c.detail.len(), MAX_STRING_BYTES)?,
        ServerMsg::Interest(i) if !i.grid.is_valid() => {
            return Err(DecodeError::Invalid {
                field: "grid",
                value: format!("{:?}", i.grid.cells),
                allowed: "1 ..= 64 cells per axis, at most 4096 in all".into(),
            });
        }
        ServerMsg::Metrics(_)
        | ServerMsg::Ack(_)
        | ServerMsg::Pong { .. }
        | ServerMsg::Interest(_) => {}
    }
    Ok(())
}

fn check_client(msg: &ClientMsg) -> Result<(), DecodeError> {
    if let ClientMsg::Command { command, .. } = msg {
        match command {
            Command::AddGoal { waypoints, .. } => {
                limit("waypoints", waypoints.len(), MAX_WAYPOINTS)?;
            }
            Command::PatchParams { changes } => {
                limit("changes", changes.len(), MAX_PARAMS)?;
                for (name, _) in changes {
                    limit("param name", name.len(), MAX_STRING_BYTES)?;
                }
            }
            Command::Preset { name } => limit("preset name", name.len(), MAX_STRING_BYTES)?,
            _ => {}
        }
    }
    Ok(())
}
