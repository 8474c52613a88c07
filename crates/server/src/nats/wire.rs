//! What origin and edges say to each other over NATS: subjects, the
//! binary envelope of frame messages, and the JSON of state and commands.
//! Every decoder takes untrusted bytes and returns a [`WireError`] naming
//! what was wrong; nothing here panics or allocates beyond the bounds below.
//!
//! One broadcast is, in this order on one connection (NATS keeps a
//! publisher's order for a subscriber):
//! 1. `{prefix}.frame.state`: [`Envelope`] + JSON [`StateMsg`];
//! 2. `{prefix}.frame.cell.{c}`, for each cell sent: [`Envelope`] + cell
//!    `u32` + part `u16` + parts `u16` + a part of the cell update (kind
//!    `0x13`, or `0x14` with the compact header, as PROTOCOL.md describes it), cut below the server's
//!    `max_payload`;
//! 3. `{prefix}.frame.end`: [`Envelope`] + messages `u32` (the cell parts
//!    sent), so an edge knows it missed none.
//!
//! All integers little-endian.

use serde::{Deserialize, Serialize};
use starling_protocol::interest::CellGrid;
use starling_protocol::limits::MAX_MESSAGE_BYTES;

use crate::command::Op;
use crate::engine::published::SimState;

/// Bytes of the envelope every frame message starts with.
pub const ENVELOPE_BYTES: usize = 16;
/// Bytes of a cell part's header after the envelope.
pub const PART_HEADER_BYTES: usize = 8;
/// Largest part of a cell update one message carries (the NATS server's
/// `max_payload`, 1 MB by default, is the other bound).
pub const PART_BYTES: usize = 256 * 1024;
/// Smallest part (but the last) an origin cuts: it refuses a NATS server
/// whose `max_payload` leaves less.
pub const MIN_PART_BYTES: usize = 16 * 1024;
/// Most parts one cell update may be cut into (the largest message in
/// smallest parts).
pub const MAX_PARTS: usize = MAX_MESSAGE_BYTES.div_ceil(MIN_PART_BYTES);
/// Largest state message (JSON) an edge accepts.
pub const MAX_STATE_BYTES: usize = 4 * 1024 * 1024;
/// Largest command (JSON) an origin accepts from an edge.
pub const MAX_COMMAND_BYTES: usize = 128 * 1024;

/// The prefix of every reply subject (a requester's inbox): the origin
/// answers asks and forwarded commands only on subjects under it.
pub const INBOX_PREFIX: &str = "_INBOX";

/// The subjects of one origin's stream.
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// Subjects under `prefix` (e.g. `starling`).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// Whether `reply` may be answered on: a requester's inbox
    /// ([`INBOX_PREFIX`]), never one of this stream's own subjects. A
    /// request names its reply subject itself, so a client allowed only to
    /// ask could otherwise have the origin publish its answers into every
    /// edge's stream (found by an audit).
    pub fn is_reply(&self, reply: &str) -> bool {
        let under = |prefix: &str| {
            reply
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('.') && rest.len() > 1)
        };
        under(INBOX_PREFIX) && !under(&self.prefix)
    }

    /// Everything one broadcast is published on (an edge subscribes to it,
    /// one subscription, so the order holds).
    pub fn frames(&self) -> String {
        format!("{}.frame.>", self.prefix)
    }

    /// The state message of a broadcast.
    pub fn state(&self) -> String {
        format!("{}.frame.state", self.prefix)
    }

    /// One cell's update.
    pub fn cell(&self, cell: u32) -> String {
        format!("{}.frame.cell.{cell}", self.prefix)
    }

    /// The end of a broadcast.
    pub fn end(&self) -> String {
        format!("{}.frame.end", self.prefix)
    }

    /// Edges ask for keyframes here (request/reply).
    pub fn keyframes(&self) -> String {
        format!("{}.keyframes", self.prefix)
    }

    /// Edges forward commands here (request/reply).
    pub fn command(&self) -> String {
        format!("{}.command", self.prefix)
    }

    /// Which frame message a subject is, under these subjects.
    pub fn kind_of(&self, subject: &str) -> Option<FrameSubject> {
        let rest = subject
            .strip_prefix(&self.prefix)?
            .strip_prefix(".frame.")?;
        match rest {
            "state" => Some(FrameSubject::State),
            "end" => Some(FrameSubject::End),
            _ => rest.strip_prefix("cell.").map(|_| FrameSubject::Cell),
        }
    }
}

/// The three frame messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameSubject {
    /// `…frame.state`
    State,
    /// `…frame.cell.{c}`
    Cell,
    /// `…frame.end`
    End,
}

/// A message that is not what its subject says.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("NATS message: {field} = {value}: expected {expected}")]
pub struct WireError {
    /// The field at fault.
    pub field: &'static str,
    /// What it held.
    pub value: String,
    /// What is allowed.
    pub expected: &'static str,
}

fn wire_error(field: &'static str, value: impl ToString, expected: &'static str) -> WireError {
    WireError {
        field,
        value: value.to_string(),
        expected,
    }
}

/// Which origin run and which broadcast a frame message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    /// Chosen at random when the origin starts: a new one means a new run
    /// (its sequence numbers start again).
    pub epoch: u64,
    /// The origin's broadcast sequence number.
    pub seq: u64,
}

impl Envelope {
    /// Appends the envelope.
    pub fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
    }

    /// Splits a message into its envelope and the rest.
    pub fn split(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        if bytes.len() < ENVELOPE_BYTES {
            return Err(wire_error(
                "length",
                bytes.len(),
                "at least the 16-byte envelope",
            ));
        }
        let (head, rest) = bytes.split_at(ENVELOPE_BYTES);
        Ok((
            Self {
                epoch: u64_at(head, 0),
                seq: u64_at(head, 8),
            },
            rest,
        ))
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// One part of a cell's update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellPart<'a> {
    /// The cell.
    pub cell: u32,
    /// This part's index, `0 .. parts`.
    pub part: u16,
    /// How many parts the update was cut into.
    pub parts: u16,
    /// The part's bytes.
    pub bytes: &'a [u8],
}

impl<'a> CellPart<'a> {
    /// Appends the part after an envelope.
    pub fn put(&self, envelope: Envelope, out: &mut Vec<u8>) {
        envelope.put(out);
        out.extend_from_slice(&self.cell.to_le_bytes());
        out.extend_from_slice(&self.part.to_le_bytes());
        out.extend_from_slice(&self.parts.to_le_bytes());
        out.extend_from_slice(self.bytes);
    }

    /// A cell's update cut into parts of at most `part_bytes` (at least
    /// one part, so an empty update is one empty part).
    pub fn cut(
        cell: u32,
        update: &'a [u8],
        part_bytes: usize,
    ) -> impl Iterator<Item = CellPart<'a>> + 'a {
        let size = part_bytes.max(1);
        let parts = parts_of(update.len(), size);
        (0..parts).map(move |k| CellPart {
            cell,
            part: k as u16,
            parts: parts as u16,
            bytes: &update[(k * size).min(update.len())..((k + 1) * size).min(update.len())],
        })
    }

    /// Parses what follows the envelope, for a grid of `cells` cells.
    pub fn parse(rest: &'a [u8], cells: usize) -> Result<Self, WireError> {
        if rest.len() < PART_HEADER_BYTES {
            return Err(wire_error(
                "length",
                rest.len() + ENVELOPE_BYTES,
                "at least 24 bytes (envelope, cell, part, parts)",
            ));
        }
        let p = Self {
            cell: u32_at(rest, 0),
            part: u16_at(rest, 4),
            parts: u16_at(rest, 6),
            bytes: &rest[PART_HEADER_BYTES..],
        };
        if p.cell as usize >= cells {
            return Err(wire_error("cell", p.cell, "an index into the grid"));
        }
        if p.parts == 0 || usize::from(p.parts) > MAX_PARTS {
            return Err(wire_error("parts", p.parts, "1 ..= MAX_PARTS"));
        }
        if p.part >= p.parts {
            return Err(wire_error("part", p.part, "below parts"));
        }
        Ok(p)
    }
}

/// How many parts `len` bytes are cut into, each at most `part_bytes`.
pub fn parts_of(len: usize, part_bytes: usize) -> usize {
    len.div_ceil(part_bytes.max(1)).max(1)
}

/// The end of a broadcast: how many cell parts were sent.
pub fn put_end(envelope: Envelope, messages: u32, out: &mut Vec<u8>) {
    envelope.put(out);
    out.extend_from_slice(&messages.to_le_bytes());
}

/// The cell parts an end message counts.
pub fn parse_end(rest: &[u8]) -> Result<u32, WireError> {
    if rest.len() != 4 {
        return Err(wire_error(
            "length",
            rest.len() + ENVELOPE_BYTES,
            "20 bytes (envelope, messages)",
        ));
    }
    Ok(u32_at(rest, 0))
}

/// What an edge needs besides the boids to answer as the origin would: the
/// origin's published state at the broadcast.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateMsg {
    /// The tick the broadcast shows.
    pub tick: u64,
    /// Every cell is sent in full (the edge starts again from these).
    pub full: bool,
    /// The world the cells' grid and box are made for.
    pub world_m: [f32; 3],
    /// Its dimensions (2 or 3).
    pub dims: u8,
    /// The origin's state.
    pub sim: SimState,
    /// The least protocol minor that reads the origin's cell updates
    /// (`Codings::minor`): an edge that reads less refuses the stream by
    /// name instead of failing on every cell it cannot parse. Sent only
    /// above [`EDGES_WITHOUT_THE_FIELD_READ`], which edges from before the
    /// field read (and, their states denying unknown fields, would refuse
    /// a state carrying it); absent, it is that.
    #[serde(
        default = "edges_without_the_field_read",
        skip_serializing_if = "read_by_edges_without_the_field"
    )]
    pub protocol_minor: u16,
    /// The origin's cell grid (cells along x, y and z), finer for a larger
    /// flock ([`starling_protocol::interest::target_cells`]). Sent only
    /// when it is not the world's least grid ([`CellGrid::for_world`]),
    /// the one edges from before the field make (they deny unknown
    /// fields); absent, it is that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid: Option<[u16; 3]>,
}

impl StateMsg {
    /// The grid the origin's cells are cut by.
    pub fn cell_grid(&self) -> CellGrid {
        self.grid.map_or_else(
            || CellGrid::for_world(self.world_m, self.dims),
            |cells| CellGrid { cells },
        )
    }

    /// What [`StateMsg::grid`] says for a broadcast cut by `grid`.
    pub fn grid_field(grid: CellGrid, world_m: [f32; 3], dims: u8) -> Option<[u16; 3]> {
        (grid != CellGrid::for_world(world_m, dims)).then_some(grid.cells)
    }
}

/// The protocol minor edges from before [`StateMsg::protocol_minor`] read
/// (range codes, 1.5).
pub const EDGES_WITHOUT_THE_FIELD_READ: u16 = starling_protocol::RANGE_MINOR;

fn edges_without_the_field_read() -> u16 {
    EDGES_WITHOUT_THE_FIELD_READ
}

fn read_by_edges_without_the_field(minor: &u16) -> bool {
    *minor <= EDGES_WITHOUT_THE_FIELD_READ
}

/// Parses a state message's JSON.
pub fn parse_state(rest: &[u8]) -> Result<StateMsg, WireError> {
    parse_json(
        rest,
        (MAX_STATE_BYTES, "at most MAX_STATE_BYTES"),
        ("state", "the state JSON"),
    )
}

/// JSON of at most `max` bytes (`allowed` says so); a parse error names
/// the field `what` and what was `expected`.
fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    (max, allowed): (usize, &'static str),
    (what, expected): (&'static str, &'static str),
) -> Result<T, WireError> {
    if bytes.len() > max {
        return Err(wire_error("length", bytes.len(), allowed));
    }
    serde_json::from_slice(bytes).map_err(|e| wire_error(what, e, expected))
}

/// An op an edge forwards to the origin, with the caller's token (the
/// origin resolves it with its own table) and the edges' shared secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandMsg {
    /// The secret the origin was started with (`--nats-secret`).
    pub secret: String,
    /// The caller's bearer token, if any.
    pub token: Option<String>,
    /// What to do.
    pub op: Op,
}

/// Parses a forwarded command.
pub fn parse_command(bytes: &[u8]) -> Result<CommandMsg, WireError> {
    parse_json(
        bytes,
        (MAX_COMMAND_BYTES, "at most MAX_COMMAND_BYTES"),
        ("command", "the command JSON"),
    )
}

/// The origin's answer to a forwarded command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CommandReply {
    /// Applied at this tick (and the id of a created agent).
    Applied {
        /// The tick.
        tick: u64,
        /// A created agent's id.
        id: Option<u32>,
    },
    /// Refused, as REST would refuse it.
    Refused {
        /// HTTP status.
        status: u16,
        /// The error class.
        error: String,
        /// The field at fault.
        field: Option<String>,
        /// What was wrong and what is allowed.
        detail: String,
        /// Certainly not applied, through no fault of the op (the origin
        /// gave its pilot's rate token back, and the edge gives back its
        /// own). Sent only when true: an edge older than this field reads
        /// any other answer as before (this one it refuses to parse, and
        /// answers 503 as it would have).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        not_applied: bool,
    },
}

/// Parses the origin's answer.
pub fn parse_reply(bytes: &[u8]) -> Result<CommandReply, WireError> {
    parse_json(
        bytes,
        (MAX_COMMAND_BYTES, "at most MAX_COMMAND_BYTES"),
        ("reply", "the reply JSON"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_go_only_to_inboxes_never_into_the_stream() {
        let subjects = Subjects::new("starling");
        assert!(subjects.is_reply("_INBOX.abc.1"));
        for bad in [
            "starling.frame.end",
            "starling.frame.state",
            "evil.reply",
            "_INBOX",
            "_INBOX.",
            "_INBOXES.x",
            "",
        ] {
            assert!(!subjects.is_reply(bad), "{bad:?}");
        }
    }
    use proptest::prelude::*;

    #[test]
    fn a_cell_part_round_trips() {
        let mut out = Vec::new();
        let env = Envelope { epoch: 7, seq: 42 };
        let part = CellPart {
            cell: 3,
            part: 1,
            parts: 2,
            bytes: b"abc",
        };
        part.put(env, &mut out);
        let (e, rest) = Envelope::split(&out).unwrap();
        assert_eq!(e, env);
        assert_eq!(CellPart::parse(rest, 8).unwrap(), part);
        // A cell beyond the grid is named.
        let err = CellPart::parse(rest, 3).unwrap_err();
        assert_eq!(err.field, "cell");
    }

    #[test]
    fn an_update_is_cut_into_parts_that_join_back() {
        let update: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let parts: Vec<_> = CellPart::cut(5, &update, 300).collect();
        assert_eq!(parts.len(), 4);
        assert!(parts.iter().all(|p| p.parts == 4 && p.cell == 5));
        let joined: Vec<u8> = parts.iter().flat_map(|p| p.bytes.iter().copied()).collect();
        assert_eq!(joined, update);
        let empty: Vec<_> = CellPart::cut(1, &[], 300).collect();
        assert_eq!(empty.len(), 1, "an empty update is one empty part");
    }

    #[test]
    fn an_end_round_trips_and_a_short_one_is_named() {
        let mut out = Vec::new();
        put_end(Envelope { epoch: 1, seq: 2 }, 99, &mut out);
        let (_, rest) = Envelope::split(&out).unwrap();
        assert_eq!(parse_end(rest).unwrap(), 99);
        assert_eq!(parse_end(&rest[..3]).unwrap_err().field, "length");
        assert_eq!(Envelope::split(&out[..10]).unwrap_err().field, "length");
    }

    #[test]
    fn subjects_name_their_kind() {
        let s = Subjects::new("starling");
        assert_eq!(s.kind_of(&s.state()), Some(FrameSubject::State));
        assert_eq!(s.kind_of(&s.cell(12)), Some(FrameSubject::Cell));
        assert_eq!(s.kind_of(&s.end()), Some(FrameSubject::End));
        assert_eq!(s.kind_of("starling.frame.other"), None);
        assert_eq!(s.kind_of("other.frame.end"), None);
        assert_eq!(parts_of(0, 10), 1);
        assert_eq!(parts_of(21, 10), 3);
    }

    #[test]
    fn a_refusal_round_trips() {
        for not_applied in [false, true] {
            let r = CommandReply::Refused {
                status: 403,
                error: "forbidden".into(),
                field: None,
                detail: "no".into(),
                not_applied,
            };
            let bytes = serde_json::to_vec(&r).unwrap();
            assert_eq!(parse_reply(&bytes).unwrap(), r);
            // Said only when true, so edges older than the field read the rest.
            let text = String::from_utf8(bytes).unwrap();
            assert_eq!(text.contains("not_applied"), not_applied, "{text}");
        }
    }

    proptest! {
        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok((_, rest)) = Envelope::split(&bytes) {
                let _ = CellPart::parse(rest, 512);
                let _ = parse_end(rest);
                let _ = parse_state(rest);
            }
            let _ = parse_command(&bytes);
            let _ = parse_reply(&bytes);
        }
    }
}
