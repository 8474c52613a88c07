//! The interest stream's shared half: each broadcast's whole frame split
//! into cell frames with their summaries ([`CellFrames`], built on the tick
//! thread while any viewer uses the stream), and the cell updates encoded
//! from them ([`CellSet`]), each encoded at most once, on the first
//! viewer's task that needs it, and shared by every viewer after. What
//! one viewer is sent, and when, is `http/ws/interest.rs`.
//!
//! A cell update is at a precision (how coarse: the viewer's distance
//! decides, see `http/ws/interest.rs`), either full, or linear against the
//! two frames of the cell a viewer holds, when both are within the last
//! [`HISTORY`] broadcasts, or from the newer alone when only it is. A cell
//! keeps at most [`FULL_FORMS`] full encodings (one per precision asked
//! for) plus the exact one (what edges hold) and the exact one without
//! headings (1.6 viewers), and [`LINEAR_FORMS`] linear
//! ones per broadcast (the first pairs of held frames, precisions and
//! protocol versions asked for: 1.4 viewers get Rice codes and compact
//! headers, 1.5 viewers range codes, 1.6 viewers no headings, so four
//! versions share the slots;
//! viewers at the same cadence, distance and version share them); a viewer
//! asking for another gets a full update, at a precision already encoded
//! when the cell has all its full forms (one no coarser than asked, with
//! headings when it asked for them and without when it did not, else the
//! exact one). So a cell has at most
//! `FULL_FORMS + 2 + LINEAR_FORMS` encodings per broadcast, however many
//! viewers there are, and [`CROPPED_FORMS`] cropped ones (`crop.rs`) made
//! for the few viewers that crop: the encode cost is flat in the viewer
//! count.
//!
//! The linear slots go first come, first served, so one network (an IPv4
//! /24, an IPv6 /48: [`Asker::viewer`]) may make at most
//! [`LINEAR_FORMS_PER_ADDRESS`] of a cell's in a broadcast, and
//! the last is kept for the NATS publisher ([`Asker`]): a client opening
//! sockets that each ask for a pair of frames, a precision or a version of
//! their own (and watch a small box, so their sends come first) could
//! take every slot, and every other viewer, and every edge, would get
//! full updates (5 to 10 times the bytes a boid) for as long as it stayed
//! (found by an audit).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use starling_protocol::interest::{
    BatchedHeader, CELL_UPDATE_HEADER_BYTES, CellGrid, CellScratch, CellSummary, Codings,
    Held as HeldFrame, Precision, SUMMARY_BYTES, encode_cell_update, put_compact_summaries,
    target_cells,
};

use starling_protocol::{Frame, QuantBox};

use super::crop::Crop;
use super::split::CellSplitter;
use crate::telemetry::Telemetry;

/// Bytes a boid takes in a full cell update: id, position and, when it
/// carries `headings` (not for a 1.6 viewer), heading.
pub fn full_bytes_per_boid(headings: bool) -> usize {
    if headings { 12 } else { 10 }
}

/// Broadcasts back that linear updates reach: a viewer whose older held
/// frame of a cell is further back is sent the cell in full. Longer gaps
/// predict poorly anyway, and each broadcast kept costs 12 bytes a boid.
pub const HISTORY: u64 = 8;
/// Full encodings (precisions) a cell keeps per broadcast, at most.
pub const FULL_FORMS: usize = 4;
/// Linear encodings a cell keeps per broadcast, at most.
pub const LINEAR_FORMS: usize = 8;
/// Of those, the most that viewers from one network may make (see
/// [`Asker::viewer`]).
pub const LINEAR_FORMS_PER_ADDRESS: usize = 3;
/// Updates cropped to a view ([`Crop`]), linear or full, a cell keeps per
/// broadcast, at most: a viewer asking for another is sent the cell whole.
pub const CROPPED_FORMS: usize = 12;
/// Of those, the most that viewers from one network may make.
pub const CROPPED_FORMS_PER_ADDRESS: usize = 3;
/// Cropped updates encoded per broadcast over every cell, at most,
/// whoever asks: past it, cells are sent whole (against the cropped frames
/// a viewer holds). The [`super::crop::CROPPING_VIEWERS`] viewers that crop
/// make about 30 to 110 a broadcast each at 100k boids (a crop costs an
/// encode of its own, about 5 µs); this bounds their crops, whatever views
/// they choose, to about 3 ms a broadcast. Past it, the whole cells they
/// get against the cropped frames they hold are encodes of their own too,
/// bounded as every linear update is ([`LINEAR_FORMS`] a cell): up to
/// about as much again.
pub const CROPPED_ENCODES: usize = 640;
/// Of those, the most that viewers from one network may make in a
/// broadcast: its share of the cropping viewers' (160, about the crops of
/// two views of a tenth of the world).
pub const CROPPED_ENCODES_PER_ADDRESS: usize =
    CROPPED_ENCODES / super::crop::CROPPING_VIEWERS * super::crop::CROPPING_VIEWERS_PER_ADDRESS;

/// Who an update is made for: a viewer, by its address block (`None`: a
/// connection with no known address, counted as one), or the NATS
/// publisher, which alone may take a cell's last linear slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Asker {
    /// A viewer from this block ([`Asker::viewer`]).
    Viewer(Option<std::net::IpAddr>),
    /// The origin's NATS publisher (every edge's updates).
    Publisher,
}

impl Asker {
    /// A viewer from `address`, counted by a wider block than the caps
    /// count by: an IPv4 /24, an IPv6 /48. Three addresses (then /64s)
    /// filled the seven slots viewers may take.
    pub fn viewer(address: std::net::IpAddr) -> Self {
        Self::Viewer(Some(crate::address::network(address)))
    }
}

/// One broadcast's cell frames.
#[derive(Debug)]
pub struct CellFrames {
    /// The broadcast's sequence number.
    pub seq: u64,
    /// The tick it shows.
    pub tick: u64,
    /// The grid the cells are cut by.
    pub grid: CellGrid,
    /// The quantisation box.
    pub quant: QuantBox,
    /// The world the grid and the box were made for (edges make theirs
    /// from it).
    pub world_m: [f32; 3],
    /// Its dimensions (2 or 3).
    pub dims: u8,
    /// Each cell's boids, in id order.
    pub cells: Vec<Frame>,
    /// How many boids each cell holds (what a viewer's priority pass reads
    /// of every cell in its view: a few kilobytes, where the frames' own
    /// lengths are a cache miss each).
    pub counts: Vec<u32>,
    /// The summary of every cell holding boids, ascending by cell.
    pub summaries: Vec<CellSummary>,
    /// The same summaries as a compact batch carries them (1.7), coded once.
    pub compact_summaries: Vec<u8>,
}

impl CellFrames {
    /// The bytes of the summaries in a batch: compact (1.7) or not.
    pub fn summary_bytes(&self, compact: bool) -> usize {
        if compact {
            self.compact_summaries.len()
        } else {
            SUMMARY_BYTES * self.summaries.len()
        }
    }
}

/// One frame of a cell a viewer holds: the seq of the broadcast it was
/// sent from, its precision and its crop (the boids of the cell it holds).
pub type HeldAt = (u64, Precision, Crop);

/// How a viewer holds a cell: the last two frames it was sent (newest first).
pub type Held = [Option<HeldAt>; 2];

/// An update of one cell against held frames: the frame it applies to,
/// the one before when linear, its precision, the codings the receiver
/// reads (by its protocol minor), and its bytes (None when it is not
/// smaller than the full update at that precision).
type LinearForm = (
    HeldAt,
    Option<HeldAt>,
    Precision,
    Codings,
    Option<Shared>,
    Asker,
);

/// A full update of one cell: its precision and bytes.
type FullForm = (Precision, Option<Shared>);

/// An update of one cell cropped to a view ([`Crop`]): the held frames it
/// applies to (None: full), its precision, its crop, the codings the
/// receiver reads, its bytes (None when a linear one is not smaller than
/// the cropped full one), who made it, and the boids it holds.
type CroppedForm = (
    Option<(HeldAt, Option<HeldAt>)>,
    Precision,
    Crop,
    Codings,
    Option<Shared>,
    Asker,
    usize,
);

/// An encoded cell update, shared among viewers: its bytes, and the header
/// it has in a compact batch (1.7), made with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shared {
    /// The update's bytes.
    pub bytes: Bytes,
    /// Its header in a compact batch.
    pub batched: BatchedHeader,
}

/// A cell update for one viewer.
#[derive(Debug, Clone)]
pub struct Update {
    /// The update (shared).
    pub shared: Shared,
    /// How the viewer holds the cell once it applies them.
    pub held: Held,
    /// Whether it is against the frames held (linear, or from the newer
    /// alone), not full.
    pub linear: bool,
    /// The boids it brings the cell to.
    pub boids: usize,
}

/// One broadcast's cells and their lazily encoded updates.
#[derive(Debug)]
pub struct CellSet {
    /// This broadcast's frames.
    pub now: Arc<CellFrames>,
    /// The frames of the broadcasts before, newest first (`past[j]` is
    /// seq − 1 − j), as far back as deltas reach ([`HISTORY`]).
    past: Vec<Arc<CellFrames>>,
    /// Each cell's full updates by precision.
    full: Vec<Mutex<Vec<FullForm>>>,
    /// Each cell's linear updates by the held pair they apply to and
    /// their precision; None when it would not be smaller than the full one.
    linear: Vec<Mutex<Vec<LinearForm>>>,
    /// Each cell's updates cropped to a view, linear and full.
    cropped: Vec<Mutex<Vec<CroppedForm>>>,
    /// Cropped updates encoded so far, by who made them ([`CROPPED_ENCODES`]).
    crop_encodes: Mutex<CropEncodes>,
    /// Time spent encoding this set's updates, nanoseconds.
    encode_ns: AtomicU64,
    telemetry: Arc<Telemetry>,
}

impl CellSet {
    /// The broadcast's sequence number.
    pub fn seq(&self) -> u64 {
        self.now.seq
    }

    /// Time spent so far encoding this broadcast's cell updates (on
    /// whichever viewer tasks needed them first).
    pub fn encode_time(&self) -> Duration {
        Duration::from_nanos(self.encode_ns.load(Ordering::Relaxed))
    }

    fn frames_at(&self, seq: u64) -> Option<&CellFrames> {
        if seq == self.now.seq {
            return Some(&self.now);
        }
        let back = self.now.seq.checked_sub(seq)?.checked_sub(1)? as usize;
        self.past.get(back).map(|f| &**f)
    }

    fn encode(
        &self,
        base: Option<HeldFrame<'_>>,
        base2: Option<HeldFrame<'_>>,
        next: &Frame,
        precision: Precision,
        codings: Codings,
    ) -> Option<Shared> {
        thread_local! {
            static SCRATCH: std::cell::RefCell<(CellScratch, Vec<u8>)> = Default::default();
        }
        let t0 = Instant::now();
        let bytes = SCRATCH.with_borrow_mut(|(scratch, out)| {
            let made = encode_cell_update(base, base2, next, precision, codings, scratch, out)
                .and_then(|()| BatchedHeader::of(out));
            match made {
                Ok(batched) => {
                    self.telemetry.cell_updates_encoded.inc();
                    Some(Shared {
                        bytes: Bytes::copy_from_slice(out),
                        batched,
                    })
                }
                Err(e) => {
                    // Our own frames: this would be a bug, not bad input.
                    tracing::error!(error = %e, "cell update not encoded");
                    None
                }
            }
        });
        let ns = t0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.encode_ns.fetch_add(ns, Ordering::Relaxed);
        bytes
    }

    /// The cell's full update at `precision`, and the precision it is at:
    /// when the cell already has [`FULL_FORMS`] full encodings, the
    /// coarsest of them no coarser than `precision`, else the exact one,
    /// made when needed (never a coarser one: a viewer is sent no cell less
    /// precise than its distance asks, whatever other viewers asked for
    /// first). The exact form is always made when asked for (edges hold
    /// cells exactly). A precision without headings (a 1.6 viewer) gets a
    /// form without headings, one with headings never (and the reverse),
    /// so a cell keeps at most `FULL_FORMS + 2`: the exact form and the
    /// exact one without headings besides.
    pub fn full(&self, cell: u32, precision: Precision) -> Option<(Shared, Precision)> {
        let c = cell as usize;
        let next = self.now.cells.get(c)?;
        let mut forms = lock(self.full.get(c)?);
        let fine_enough = |p: &Precision| {
            p.has_heading() == precision.has_heading()
                && p.pos_shift <= precision.pos_shift
                && p.heading_shift <= precision.heading_shift
        };
        let found = forms.iter().find(|f| f.0 == precision).or_else(|| {
            (forms.len() >= FULL_FORMS).then(|| {
                let key = |f: &&FullForm| (f.0.pos_shift, f.0.heading_shift);
                forms.iter().filter(|f| fine_enough(&f.0)).max_by_key(key)
            })?
        });
        if let Some((p, bytes)) = found {
            return bytes.clone().map(|b| (b, *p));
        }
        // No room for another precision, and none fine enough: the exact
        // form (not among them, or it would have been found).
        let precision = match (forms.len() >= FULL_FORMS, precision.has_heading()) {
            (false, _) => precision,
            (true, true) => Precision::EXACT,
            (true, false) => Precision::EXACT.without_heading(),
        };
        let bytes = self.encode(None, None, next, precision, Codings::Fixed);
        forms.push((precision, bytes.clone()));
        bytes.map(|b| (b, precision))
    }

    /// The cheapest update that brings a viewer holding the cell as `held`
    /// to this broadcast at `precision` (or near it) and `crop` (or the
    /// whole cell, when the cell has no room for another cropped form or
    /// the broadcast made its [`CROPPED_ENCODES`], in all or for `asker`);
    /// `codings`: what the viewer reads; `asker`: who it is for (a linear
    /// or cropped slot taken is theirs).
    pub fn update_for(
        &self,
        cell: u32,
        held: Held,
        precision: Precision,
        crop: Crop,
        codings: Codings,
        asker: Asker,
    ) -> Option<Update> {
        let seq = self.now.seq;
        let c = cell as usize;
        // Against both frames held when both are recent enough, else
        // against the newer alone (so a cell whose second frame came late,
        // say after a large full update, is not sent in full again).
        let recent = |h: Option<HeldAt>| h.filter(|f| f.0 < seq && seq - f.0 <= HISTORY);
        let pair = recent(held[0]).map(|a| (a, recent(held[1]).filter(|b| b.0 < a.0)));
        if !crop.is_whole() && !matches!(asker, Asker::Publisher) {
            if let Some((a, b)) = pair
                && let Some((shared, boids)) =
                    self.cropped(c, Some((a, b)), precision, crop, codings, asker)
            {
                return Some(Update {
                    shared,
                    held: [Some((seq, precision, crop)), Some(a)],
                    linear: true,
                    boids,
                });
            }
            if let Some((shared, boids)) =
                self.cropped(c, None, precision, crop, Codings::Fixed, asker)
            {
                return Some(Update {
                    shared,
                    held: [Some((seq, precision, crop)), held[0]],
                    linear: false,
                    boids,
                });
            }
        }
        let boids = self.now.cells.get(c)?.len();
        if let Some((a, b)) = pair
            && let Some(shared) = self.linear(c, (a, b), precision, codings, asker)
        {
            return Some(Update {
                shared,
                held: [Some((seq, precision, Crop::WHOLE)), Some(a)],
                linear: true,
                boids,
            });
        }
        // The receiver keeps the frame it held as the one before.
        let (shared, p) = self.full(cell, precision)?;
        Some(Update {
            shared,
            held: [Some((seq, p, Crop::WHOLE)), held[0]],
            linear: false,
            boids,
        })
    }

    /// The update of cell `c` cropped to `crop`, against its frames held
    /// as `pair` (None: full), at `precision`, and the boids it holds;
    /// encoded once, None when not kept, when `asker` may make no more, or
    /// when a linear one is not smaller than the cropped full one.
    fn cropped(
        &self,
        c: usize,
        pair: Option<(HeldAt, Option<HeldAt>)>,
        precision: Precision,
        crop: Crop,
        codings: Codings,
        asker: Asker,
    ) -> Option<(Shared, usize)> {
        let mut forms = lock(self.cropped.get(c)?);
        let serves =
            |f: &CroppedForm| f.3 == codings || (codings == Codings::Fixed && f.4.is_none());
        if let Some(f) = forms
            .iter()
            .find(|f| f.0 == pair && f.1 == precision && f.2 == crop && serves(f))
        {
            return f.4.clone().map(|b| (b, f.6));
        }
        if forms.len() >= CROPPED_FORMS
            || forms.iter().filter(|f| f.5 == asker).count() >= CROPPED_FORMS_PER_ADDRESS
            || !lock(&self.crop_encodes).take(asker)
        {
            return None;
        }
        let made = CROP_SCRATCH.with_borrow_mut(|[next, base, base2]| {
            self.crop_into(crop, c, self.now.cells.get(c)?, next);
            let bytes = match pair {
                None => self.encode(None, None, next, precision, Codings::Fixed),
                Some(pair) => {
                    self.against_held(c, pair, next, precision, codings, [base, base2])?
                }
            };
            Some((bytes, next.len()))
        });
        let (bytes, boids) = made?;
        self.telemetry.cropped_updates_encoded.inc();
        forms.push((pair, precision, crop, codings, bytes.clone(), asker, boids));
        bytes.map(|b| (b, boids))
    }

    /// Writes `whole`, cell `c`'s frame, cropped to `crop` into `out`;
    /// counted as encoding time (it is part of making a cropped update).
    fn crop_into(&self, crop: Crop, c: usize, whole: &Frame, out: &mut Frame) {
        let t0 = Instant::now();
        crop.apply(&self.now.grid, c as u32, whole, out);
        let ns = t0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.encode_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// `next`, a frame of cell `c`, encoded against the cell's frames held
    /// as `a` and, when linear, `b` (cropped into `scratch` as they were
    /// sent): None when a held frame is past the history, Some(None) when
    /// the update would not be smaller than a full one of `next` (its size
    /// is known without encoding it).
    fn against_held(
        &self,
        c: usize,
        (a, b): (HeldAt, Option<HeldAt>),
        next: &Frame,
        precision: Precision,
        codings: Codings,
        [base, base2]: [&mut Frame; 2],
    ) -> Option<Option<Shared>> {
        let full_len =
            CELL_UPDATE_HEADER_BYTES + full_bytes_per_boid(precision.has_heading()) * next.len();
        let base = self.held_frame(c, a, base)?;
        let base2 = match b {
            Some(b) => Some(self.held_frame(c, b, base2)?),
            None => None,
        };
        Some(
            self.encode(Some(base), base2, next, precision, codings)
                .filter(|l| l.bytes.len() < full_len),
        )
    }

    /// Cell `c`'s frame as held at `at` (cropped into `scratch` when it
    /// was sent cropped).
    fn held_frame<'a>(
        &'a self,
        c: usize,
        (seq, precision, crop): HeldAt,
        scratch: &'a mut Frame,
    ) -> Option<HeldFrame<'a>> {
        let whole = self.frames_at(seq)?.cells.get(c)?;
        let frame = if crop.is_whole() {
            whole
        } else {
            self.crop_into(crop, c, whole, scratch);
            &*scratch
        };
        Some(HeldFrame { frame, precision })
    }

    /// The update of cell `c` against its frames held as `a` and, when
    /// linear, `b`, at `precision` (encoded once; None when not kept, when
    /// `asker` may take no more slots, or when not smaller than the full one).
    fn linear(
        &self,
        c: usize,
        (a, b): (HeldAt, Option<HeldAt>),
        precision: Precision,
        codings: Codings,
        asker: Asker,
    ) -> Option<Shared> {
        let mut forms = lock(self.linear.get(c)?);
        // A form of any level that is not smaller than the full update is
        // also what a 1.2 reader gets (the full one): every level tries
        // fixed-width fields, all a 1.2 reader reads.
        let serves =
            |f: &LinearForm| f.3 == codings || (codings == Codings::Fixed && f.4.is_none());
        if let Some(f) = forms
            .iter()
            .find(|f| f.0 == a && f.1 == b && f.2 == precision && serves(f))
        {
            return f.4.clone();
        }
        let room = match asker {
            Asker::Publisher => forms.len() < LINEAR_FORMS,
            Asker::Viewer(_) => {
                forms.len() < LINEAR_FORMS - 1
                    && forms.iter().filter(|f| f.5 == asker).count() < LINEAR_FORMS_PER_ADDRESS
            }
        };
        if !room {
            return None;
        }
        let bytes = CROP_SCRATCH.with_borrow_mut(|[_, base, base2]| {
            self.against_held(
                c,
                (a, b),
                &self.now.cells[c],
                precision,
                codings,
                [base, base2],
            )
        })?;
        forms.push((a, b, precision, codings, bytes.clone(), asker));
        bytes
    }
}

/// The cropped updates a broadcast has encoded: in all, and by each
/// network that made any.
#[derive(Debug, Default)]
struct CropEncodes {
    total: usize,
    by_asker: HashMap<Asker, usize>,
}

impl CropEncodes {
    /// Counts one more for `asker`, unless that would pass
    /// [`CROPPED_ENCODES`] or [`CROPPED_ENCODES_PER_ADDRESS`].
    fn take(&mut self, asker: Asker) -> bool {
        if self.total >= CROPPED_ENCODES {
            return false;
        }
        let made = self.by_asker.entry(asker).or_default();
        if *made >= CROPPED_ENCODES_PER_ADDRESS {
            return false;
        }
        *made += 1;
        self.total += 1;
        true
    }
}

thread_local! {
    /// Cropped frames an encode reads: the new one and the two held.
    static CROP_SCRATCH: std::cell::RefCell<[Frame; 3]> = Default::default();
}

/// A lock whose holder panicking leaves the forms usable (they are only
/// ever appended to, whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Frames kept after they leave the ring for their buffers to be reused
/// (a set lives while its broadcast is being sent: a broadcast or two).
const RETIRED: usize = 4;

/// Splits each broadcast into cells and keeps the frames deltas need.
#[derive(Debug, Default)]
pub struct CellBuilder {
    /// Frames of recent broadcasts, newest first.
    ring: VecDeque<Arc<CellFrames>>,
    /// Split buffers to reuse: the cells of frames that left the ring, once
    /// nothing refers to them (else the split allocates).
    spare: Vec<Frame>,
    /// Frames that left the ring, oldest first, until no cell set refers
    /// to them (the newest set still reaches the one that just left: it is
    /// [`HISTORY`] broadcasts back), at most [`RETIRED`].
    retired: VecDeque<Arc<CellFrames>>,
    /// The cells the grid aims for ([`target_cells`]: finer for a larger
    /// flock; 0 before the first build).
    target: usize,
    /// The split's buffers.
    splitter: CellSplitter,
}

impl CellBuilder {
    /// Forgets the recent frames: the next set starts a new chain (after a
    /// jump no delta can describe).
    pub fn restart(&mut self) {
        self.ring.clear();
        // Nothing is kept for a split that may never come (no interest
        // viewer is connected while the tick restarts the chain each time).
        self.retired.clear();
        self.splitter = CellSplitter::default();
    }

    /// Builds the cells of broadcast `seq` from its whole frame.
    pub fn build(
        &mut self,
        seq: u64,
        whole: &Frame,
        world_m: [f32; 3],
        dims: u8,
        telemetry: &Arc<Telemetry>,
    ) -> Option<Arc<CellSet>> {
        let quant = whole.quant?;
        self.target = target_cells(whole.len(), dims, self.target);
        let grid = CellGrid::for_world_aiming(world_m, dims, self.target);
        // A new chain when the grid, the box or the clock changed.
        if self.ring.front().is_some_and(|f| {
            f.grid != grid || f.quant != quant || f.tick >= whole.tick || f.seq + 1 != seq
        }) {
            self.ring.clear();
        }
        let mut cells = std::mem::take(&mut self.spare);
        let summaries = self.splitter.split(&grid, whole, &quant, &mut cells);
        let mut compact_summaries = Vec::with_capacity(9 * summaries.len());
        put_compact_summaries(&summaries, &grid, &quant, &mut compact_summaries);
        let now = Arc::new(CellFrames {
            seq,
            tick: whole.tick,
            grid,
            quant,
            world_m,
            dims,
            counts: cells.iter().map(|f| f.len() as u32).collect(),
            cells,
            summaries,
            compact_summaries,
        });
        let n = grid.len();
        let set = CellSet {
            now: now.clone(),
            past: self.ring.iter().cloned().collect(),
            full: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            linear: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            cropped: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            crop_encodes: Mutex::new(CropEncodes::default()),
            encode_ns: AtomicU64::new(0),
            telemetry: telemetry.clone(),
        };
        self.ring.push_front(now);
        while self.ring.len() > HISTORY as usize {
            self.retired.extend(self.ring.pop_back());
        }
        // The oldest frames' buffers become the next split's, once no cell
        // set refers to them any more (the one that just left is still in
        // this set's reach: freed at once, nothing was ever reused, and a
        // 2048-cell split grew 6000 columns from nothing, 3.5 ms at 100k).
        while let Some(old) = self.retired.pop_front() {
            match Arc::try_unwrap(old) {
                Ok(old) => self.spare = old.cells,
                Err(old) => {
                    self.retired.push_front(old);
                    break;
                }
            }
        }
        while self.retired.len() > RETIRED {
            self.retired.pop_front();
        }
        Some(Arc::new(set))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_protocol::interest::{
        CellMirror, CellUpdateView, Coding, FLAG_COMPLETE_SUMMARIES, KIND_CELL_UPDATE, begin_batch,
        push_update,
    };

    fn whole(tick: u64, xs: &[(u32, u16)]) -> Frame {
        Frame {
            tick,
            quant: Some(QuantBox::around_world([100.0, 100.0, 50.0], 3)),
            ids: xs.iter().map(|b| b.0).collect(),
            pos: xs.iter().flat_map(|b| [b.1, 100, 100]).collect(),
            heading: xs.iter().flat_map(|_| [128, 128]).collect(),
        }
    }

    #[test]
    fn viewers_at_any_stride_are_sent_updates_their_mirror_applies() {
        let tel = Arc::new(Telemetry::default());
        let mut b = CellBuilder::default();
        let grid = CellGrid::for_world([100.0, 100.0, 50.0], 3);
        let quant = QuantBox::around_world([100.0, 100.0, 50.0], 3);
        // Viewers sent every broadcast, every second and every fourth (the
        // longest stride whose two held frames are within HISTORY), each at
        // its own precision.
        let strides = [1u64, 2, HISTORY / 2];
        let precisions = [
            Precision::EXACT,
            Precision::new(3, 2).unwrap(),
            Precision::new(6, 3).unwrap(),
        ];
        let mut mirrors: Vec<CellMirror> = strides
            .iter()
            .map(|_| CellMirror::new(grid, quant))
            .collect();
        let mut held: Vec<Vec<Held>> = strides
            .iter()
            .map(|_| vec![[None, None]; grid.len()])
            .collect();
        let mut batch = Vec::new();
        let mut kinds = vec![[0usize; 2]; strides.len()];
        for seq in 1..=24u64 {
            // Boids fly along x through the cells, one by one.
            let f = whole(
                seq * 2,
                &[
                    (1, (seq * 700) as u16),
                    (2, (seq * 900 + 50) as u16),
                    (5, 30_000),
                ],
            );
            let set = b.build(seq, &f, [100.0, 100.0, 50.0], 3, &tel).unwrap();
            for (v, &stride) in strides.iter().enumerate() {
                if seq % stride != 0 {
                    continue;
                }
                begin_batch(
                    f.tick,
                    &set.now.summaries,
                    FLAG_COMPLETE_SUMMARIES,
                    &[],
                    &mut batch,
                );
                for c in 0..grid.len() as u32 {
                    let h = &mut held[v][c as usize];
                    if set.now.cells[c as usize].is_empty() && h[0].is_none() {
                        continue;
                    }
                    let codings = [Codings::Range, Codings::Fixed, Codings::Rice][v % 3];
                    let asker = Asker::viewer(std::net::IpAddr::from([10, 0, v as u8, 0]));
                    let u = set
                        .update_for(c, *h, precisions[v], Crop::WHOLE, codings, asker)
                        .unwrap();
                    // Only a 1.4 or later reader gets the compact header,
                    // Rice codes from 1.4 on, range codes only to 1.5.
                    assert!(
                        codings >= Codings::Rice || u.shared.bytes[0] == KIND_CELL_UPDATE,
                        "viewer {v}"
                    );
                    let coding = CellUpdateView::parse(&u.shared.bytes).unwrap().coding;
                    let readable = match coding {
                        Coding::Fixed(..) => true,
                        Coding::Rice(..) => codings >= Codings::Rice,
                        Coding::Range => codings == Codings::Range,
                    };
                    assert!(readable, "viewer {v} ({codings:?}) got {coding:?}");
                    kinds[v][usize::from(u.linear)] += 1;
                    *h = u.held;
                    push_update(c, &u.shared.bytes, &mut batch);
                }
                mirrors[v].apply(&batch).unwrap();
                for c in 0..grid.len() as u32 {
                    if held[v][c as usize][0].is_some() {
                        let mut want = Frame::default();
                        precisions[v].coarsen(&set.now.cells[c as usize], &mut want);
                        assert_eq!(
                            mirrors[v].cell(c),
                            Some(&want),
                            "viewer {v} cell {c} seq {seq}"
                        );
                    }
                }
            }
        }
        // Every stride reaches deltas after two full updates.
        assert!(kinds.iter().all(|k| k[1] > 0 && k[0] > 0), "{kinds:?}");
        // Encodings are shared: far fewer than viewers × cells × sends.
        assert!(tel.cell_updates_encoded.get() > 0);
    }

    /// One broadcast's cells of a single boid, the telemetry counting
    /// their encodings, and that boid's cell.
    fn one_boid_set() -> (Arc<Telemetry>, Arc<CellSet>, u32) {
        let tel = Arc::new(Telemetry::default());
        let set = CellBuilder::default()
            .build(1, &whole(2, &[(1, 500)]), [100.0, 100.0, 50.0], 3, &tel)
            .unwrap();
        let c = set.now.grid.cell_of([500, 100, 100]);
        (tel, set, c)
    }

    #[test]
    fn the_exact_form_is_made_even_when_the_coarse_ones_are_used_up() {
        let (_, set, c) = one_boid_set();
        for shift in 1..=FULL_FORMS as u8 {
            let p = Precision::new(shift, 0).unwrap();
            assert_eq!(set.full(c, p).unwrap().1, p);
        }
        // A fifth coarse precision gets the coarsest one already made that
        // is fine enough ...
        let fifth = Precision::new(7, 0).unwrap();
        assert_eq!(set.full(c, fifth).unwrap().1, Precision::new(4, 0).unwrap());
        // ... but exact is always exact (an edge must hold the cell as it is).
        assert_eq!(set.full(c, Precision::EXACT).unwrap().1, Precision::EXACT);
    }

    #[test]
    fn a_viewer_never_gets_a_full_update_coarser_than_it_asked_for() {
        // Four far viewers at coarse precisions use up the cell's full
        // forms; a near viewer asking for (1, 0) got the finest of them,
        // (3, 1): drawn off by more than its half pixel, and held as such.
        let (tel, set, c) = one_boid_set();
        for (pos, heading) in [(6, 3), (5, 3), (4, 2), (3, 1)] {
            let p = Precision::new(pos, heading).unwrap();
            assert_eq!(set.full(c, p).unwrap().1, p);
        }
        let near = Precision::new(1, 0).unwrap();
        let (exact, got) = set.full(c, near).unwrap();
        assert_eq!(got, Precision::EXACT, "finer than asked, never coarser");
        // The exact form is made once, and serves the next such viewer.
        let encoded = tel.cell_updates_encoded.get();
        assert_eq!(set.full(c, near).unwrap(), (exact, Precision::EXACT));
        // (3, 2) takes (3, 1), the coarsest fine enough; (2, 2) the exact.
        let p = |pos, heading| Precision::new(pos, heading).unwrap();
        assert_eq!(set.full(c, p(3, 2)).unwrap().1, p(3, 1));
        assert_eq!(set.full(c, p(2, 2)).unwrap().1, Precision::EXACT);
        assert_eq!(tel.cell_updates_encoded.get(), encoded);
    }

    #[test]
    fn a_viewer_without_headings_never_gets_a_full_update_with_them_nor_the_reverse() {
        // Older viewers use up the cell's full forms with headings: a 1.6
        // viewer gets none of them but the exact form without headings ...
        let (_, set, c) = one_boid_set();
        let p = |pos, heading| Precision::new(pos, heading).unwrap();
        for q in [p(1, 0), p(2, 1), p(3, 1), p(4, 2)] {
            assert_eq!(set.full(c, q).unwrap().1, q);
        }
        for pos in [0, 3, 6] {
            let got = set.full(c, p(pos, 0).without_heading()).unwrap().1;
            assert_eq!(got, Precision::EXACT.without_heading(), "asked for {pos}");
        }
        // ... and with the forms used up by 1.6 viewers, an older one gets
        // the exact form with headings, never one without.
        let (_, set, c) = one_boid_set();
        for pos in [1, 2, 3, 4] {
            let q = p(pos, 0).without_heading();
            assert_eq!(set.full(c, q).unwrap().1, q);
        }
        assert_eq!(set.full(c, p(6, 3)).unwrap().1, Precision::EXACT);
        assert_eq!(
            set.full(c, p(5, 0).without_heading()).unwrap().1,
            p(4, 0).without_heading()
        );
    }

    #[test]
    fn a_clock_that_goes_back_starts_a_new_chain() {
        let tel = Arc::new(Telemetry::default());
        let mut b = CellBuilder::default();
        for seq in 1..=3 {
            b.build(
                seq,
                &whole(10 * seq, &[(1, 500)]),
                [100.0, 100.0, 50.0],
                3,
                &tel,
            );
        }
        let set = b
            .build(4, &whole(5, &[(1, 500)]), [100.0, 100.0, 50.0], 3, &tel)
            .unwrap();
        assert!(set.past.is_empty());
        let c = set.now.grid.cell_of([500, 100, 100]);
        let e = Precision::EXACT;
        let u = set
            .update_for(
                c,
                [Some((3, e, Crop::WHOLE)), Some((2, e, Crop::WHOLE))],
                e,
                Crop::WHOLE,
                Codings::Range,
                Asker::Publisher,
            )
            .unwrap();
        assert!(!u.linear);
        assert_eq!(
            u.held,
            [Some((4, e, Crop::WHOLE)), Some((3, e, Crop::WHOLE))],
            "a full update after the jump"
        );
    }

    #[test]
    fn a_viewer_whose_older_frame_is_too_old_is_sent_against_the_newer_alone() {
        let tel = Arc::new(Telemetry::default());
        let mut b = CellBuilder::default();
        let e = Precision::EXACT;
        let mut set = None;
        for seq in 1..=12u64 {
            set = b.build(
                seq,
                &whole(2 * seq, &[(1, 500 + 10 * seq as u16)]),
                [100.0, 100.0, 50.0],
                3,
                &tel,
            );
        }
        let set = set.unwrap();
        let c = set.now.grid.cell_of([600, 100, 100]);
        // Held at seq 10 (recent) and seq 2 (beyond HISTORY): from seq 10 alone.
        let u = set
            .update_for(
                c,
                [Some((10, e, Crop::WHOLE)), Some((2, e, Crop::WHOLE))],
                e,
                Crop::WHOLE,
                Codings::Range,
                Asker::Publisher,
            )
            .unwrap();
        assert!(u.linear, "not a full update");
        assert_eq!(
            u.held,
            [Some((12, e, Crop::WHOLE)), Some((10, e, Crop::WHOLE))]
        );
        let view = starling_protocol::interest::CellUpdateView::parse(&u.shared.bytes).unwrap();
        assert_eq!(view.predict, starling_protocol::interest::Predict::FromBase);
        // Held only at seq 2: in full.
        assert!(
            !set.update_for(
                c,
                [Some((2, e, Crop::WHOLE)), None],
                e,
                Crop::WHOLE,
                Codings::Range,
                Asker::Publisher
            )
            .unwrap()
            .linear
        );
    }

    /// One address makes at most its share of a cell's linear updates in a
    /// broadcast, however many keys it asks for (its own then go in full),
    /// and the last slot is the NATS publisher's: another address, and
    /// every edge, still get linear updates.
    #[test]
    fn one_address_takes_at_most_its_share_of_the_linear_slots() {
        let tel = Arc::new(Telemetry::default());
        let mut b = CellBuilder::default();
        let mut set = None;
        for seq in 1..=3u64 {
            set = b.build(
                seq,
                &whole(2 * seq, &[(1, 500 + 10 * seq as u16), (2, 520)]),
                [100.0, 100.0, 50.0],
                3,
                &tel,
            );
        }
        let set = set.unwrap();
        let c = set.now.grid.cell_of([530, 100, 100]);
        // A key of its own for each ask: the frames held at another precision.
        let ask = |k: u8, asker: Asker| {
            let p = Precision::new(k % 7, k / 7).unwrap();
            set.update_for(
                c,
                [Some((2, p, Crop::WHOLE)), Some((1, p, Crop::WHOLE))],
                p,
                Crop::WHOLE,
                Codings::Range,
                asker,
            )
            .unwrap()
            .linear
        };
        let address = |n: u8| Asker::viewer(std::net::IpAddr::from([10, 0, n, 1]));
        let first: Vec<bool> = (0..6).map(|k| ask(k, address(1))).collect();
        assert_eq!(
            first.iter().filter(|&&l| l).count(),
            LINEAR_FORMS_PER_ADDRESS,
            "{first:?}"
        );
        // Others fill the slots viewers may take...
        let mut k = 6;
        let mut n = 2;
        let viewers_may = LINEAR_FORMS - 1;
        for _ in LINEAR_FORMS_PER_ADDRESS..viewers_may {
            assert!(ask(k, address(n)), "address {n}");
            k += 1;
            n += 1;
        }
        // ...then a viewer's new key goes in full, and the publisher's is linear.
        assert!(!ask(k, address(n)));
        assert!(ask(k + 1, Asker::Publisher));
        // A key already made is shared with anyone.
        assert!(ask(0, address(99)));
    }

    #[test]
    fn linear_slots_are_counted_by_the_ipv4_24_and_the_ipv6_48() {
        let v = |s: &str| Asker::viewer(s.parse().unwrap());
        assert_eq!(v("192.0.2.7"), v("192.0.2.200"));
        assert_ne!(v("192.0.2.7"), v("192.0.3.7"));
        assert_eq!(v("::ffff:192.0.2.7"), v("192.0.2.9"));
        assert_eq!(v("2001:db8:1:2::1"), v("2001:db8:1:ffff:1::9"));
        assert_ne!(v("2001:db8:1::1"), v("2001:db8:2::1"));
    }
}
