//! One viewer's half of the interest stream: what it looks at, which cells
//! it holds and since when, and the batch it is sent at each send.
//!
//! Level of detail: the cells in view nearest the camera and most inside
//! the view (weight: the share of the cell inside the view, of its crop
//! when the viewer crops, over 1 + distance in cell edges), as many as the budget can update at a regular
//! cadence of [`FULL_HZ`] or more (at the bytes per boid this viewer's
//! updates measure, or a full update's for a viewer whose turns are
//! further apart than the cells' history), are held in full; the rest of the flock, in view or
//! not, is drawn from summaries. Each send: the summaries of every cell
//! when they are due ([`SUMMARY_HZ`], or less often where that would take
//! more than [`SUMMARY_SHARE`] of the budget); the held cells that left the view
//! or the full set, to forget; then the updates of the full set's cells
//! whose turn it is ([`FULL_HZ`], [`turn`]) or that missed theirs, those
//! held recently enough for a linear update first, then those that need a
//! full one, each stalest and heaviest first (staleness in broadcasts times
//! weight), while the budget allows. The updates themselves are the shared ones of
//! `engine/interest.rs`.
//!
//! Each held cell is sent at the coarsest precision its distance from the
//! eye allows ([`precision_at`]): each coordinate within half a pixel and
//! headings within half a pixel at the tip of a metre-long boid, on a
//! 1080-pixel-tall view of the viewer's field of view. A 1.6 viewer gets
//! no headings at all (it points each boid along its motion): a heading
//! is about two-fifths of a formed flock's field bits.

use std::time::Duration;

use axum::body::Bytes;
use starling_protocol::interest::{
    BATCH_HEADER_BYTES, CELL_UPDATE_HEADER_BYTES, COMPACT_BATCH_HEADER_BYTES, CellGrid, Codings,
    FLAG_COMPLETE_SUMMARIES, FLAG_RESET, Precision, UPDATE_HEADER_BYTES, begin_batch,
    begin_compact_batch, push_compact_update, push_update,
};
use starling_protocol::{COMPACT_BATCH_MINOR, InterestInfo, NO_HEADING_MINOR, QuantBox, View};

use super::budget::Budget;
use crate::engine::crop::{Asked, Crop, CropSlot, CropSlots, CropWait};
use crate::engine::interest::{Asker, CellSet, HISTORY, Held, Shared, full_bytes_per_boid};

/// How often the summaries of every cell are sent, per second...
pub const SUMMARY_HZ: f32 = 2.0;
/// ...unless that would take more than this share of the budget: a wide,
/// flat world has many cells (2000 × 2000 × 30 m: 1024, 41 kB/s of
/// summaries twice a second), and at a small budget its summaries took
/// the whole of it and more (the viewer held no cell, and was sent more
/// than its budget); they then go less often.
const SUMMARY_SHARE: f32 = 0.5;
/// The share of the budget the summaries and the full set are sized to
/// (the rest pays for the full updates of cells joining the set; the
/// token bucket holds a fifth of a second, so the sends that carry the
/// full set's turns, two in three at 30 broadcasts a second, draw on it).
/// Times [`HYSTERESIS`] it stays within the budget.
const FULL_SHARE: f32 = 0.95;
/// The least update rate the full set is sized for, per second: cells held
/// in full are updated at a stride of k broadcasts, k a whole or half
/// number, the largest that keeps them at this rate or more at the
/// measured broadcast rate (k = 1.5 at 30 broadcasts a second: two in
/// three, 33 and 67 ms apart). Every cell of every viewer at that stride
/// takes its turns at the same broadcasts ([`turn`]), so a viewer's cells
/// move in step (a boid crossing between two of them is drawn in one,
/// unless a cell missed its turn or just joined), and the pairs of frames
/// viewers hold are the same, so cell encodings stay shared (see
/// `engine/interest.rs`).
pub const FULL_HZ: f32 = 20.0;
/// The fewest updates a second the full set is sized for (a stream that
/// sends less often sizes it as if it sent once a second).
const MIN_FULL_HZ: f32 = 1.0;
/// How far under the rate a stride is chosen for the measured broadcast
/// rate may be (a share of it) for the stride to be taken, so a stream at
/// its nominal rate, measured a little slow, gets it...
const CADENCE_SLACK: f32 = 0.05;
/// ...and how far under it the rate must fall before the stride is given
/// up for a shorter one: a send late by a tick or two, or a server that
/// broadcasts a little under its rate, does not flip the cadence (and the
/// full set's size with it).
const KEEP_SLACK: f32 = 0.15;
/// A send after a silence (an edge out of step): more than this long
/// since the last, and fewer than half the broadcasts the measured rate
/// expects. The rate's window starts over there, as it does at a paused
/// server's sends and the first after them (steps are not its rate).
const GAP: Duration = Duration::from_millis(250);
/// The longest stride of the full set, in half broadcasts.
const MAX_STRIDE_HALVES: u64 = 16;
/// The broadcast rate assumed before one is measured (the default
/// snapshot rate), and the window it is measured over.
const START_BROADCAST_HZ: f32 = 30.0;
const BROADCAST_RATE_WINDOW: Duration = Duration::from_secs(1);

/// The turn broadcast `seq` falls in at a stride of `halves` half
/// broadcasts: it steps up two times in every `halves` broadcasts, evenly
/// spread. A cell of the full set is due when the turn has stepped up
/// since the broadcast it was last sent at (so a cell that missed its
/// turn goes at the next send).
fn turn(seq: u64, halves: u64) -> u64 {
    2 * seq / halves
}

/// Whether a frame held from broadcast `held` is recent enough at broadcast
/// `seq` for an update against it (as `CellSet::update_for` judges).
fn recent(held: u64, seq: u64) -> bool {
    held < seq && seq - held <= HISTORY
}

/// The longest stride (in half broadcasts) that keeps the full set at
/// [`FULL_HZ`] or more at `broadcast_hz` broadcasts a second, `slack`
/// short of it allowed.
fn stride_for(broadcast_hz: f32, slack: f32) -> u64 {
    ((2.0 * broadcast_hz * (1.0 + slack) / FULL_HZ).floor() as u64).clamp(2, MAX_STRIDE_HALVES)
}

/// Held cells stay in the full set up to this much over its size, so a
/// cell at the edge does not join and leave at every send.
const HYSTERESIS: f32 = 1.05;
/// Bytes per boid a linear update is assumed to cost before any is
/// measured, besides its headers, by the codings the viewer reads
/// (fixed-width fields, Rice codes, range codes: [`Codings`] in order): a
/// little over what the interest benchmark's probe pays a boid with
/// everything counted (2.2, 1.6 and 1.5 at 100k boids), so a new viewer
/// starts near its budget's worth and grows into it.
const START_BYTES_PER_BOID: [f32; 3] = [2.6, 2.0, 1.8];
/// The same for a 1.6 viewer, whose updates carry no headings (the probe
/// pays about 0.95).
const START_BYTES_PER_BOID_NO_HEADING: f32 = 1.2;

/// What a viewer that subscribed with protocol minor `minor` is assumed to
/// pay a boid until measured.
fn start_bytes_per_boid(minor: u16) -> f32 {
    if minor >= NO_HEADING_MINOR {
        START_BYTES_PER_BOID_NO_HEADING
    } else {
        START_BYTES_PER_BOID[Codings::for_minor(minor) as usize]
    }
}
/// Bytes of a cell update besides its boids (the batch's entry and the
/// update's header) until measured, and for a full update.
const UPDATE_OVERHEAD: f32 = (UPDATE_HEADER_BYTES + CELL_UPDATE_HEADER_BYTES) as f32;
/// Most bytes a compact batch's record adds around an update's header and
/// fields: its cell and its length, two varints of at most 10 bytes.
const MAX_RECORD_FRAMING: usize = 20;
/// The same in a compact batch (1.7): a cell and a length of two bytes
/// each, and a header of about eight (a full update's, four).
const COMPACT_UPDATE_OVERHEAD: f32 = 12.0;

/// What a cell update costs besides its boids, in a compact batch or not.
fn update_overhead(compact: bool) -> f32 {
    if compact {
        COMPACT_UPDATE_OVERHEAD
    } else {
        UPDATE_OVERHEAD
    }
}

/// The angle a pixel spans, radians: the viewer's 0.9 rad tall field of
/// view on 1080 pixels (`2 · tan(0.45) / 1080`).
const PIXEL_RAD: f32 = 8.9455e-4;
/// The length a boid's heading is judged over, metres: a heading is sent
/// precisely enough to put the tip of a boid this long within half a pixel.
const HEADING_REACH_M: f32 = 1.0;
/// The angle one step of an octahedral heading byte turns a heading by,
/// at most (about), radians: the quantisation's 0.95° worst case is half
/// a step along both bytes.
const HEADING_STEP_RAD: f32 = 0.0234;
/// The coarsest precision sent: far cells are still drawn within a pixel
/// or two, and their updates already cost under two bytes a boid.
const COARSEST: Precision = Precision {
    pos_shift: 6,
    heading_shift: 3,
};

/// The coarsest precision that keeps a boid `distance_m` from the eye
/// within half a pixel (see the module docs).
pub fn precision_at(distance_m: f32, quant: &QuantBox) -> Precision {
    let pixel = distance_m.max(0.0) * PIXEL_RAD;
    let step = quant.step_m().into_iter().fold(0.0f32, f32::max).max(1e-9);
    // Drawn at the middle of a step of 2^s, a coordinate is within 2^(s−1)
    // of the exact one; a heading likewise within 2^(h−1) steps.
    let shift = |ratio: f32, max: u8| -> u8 {
        if ratio >= 1.0 {
            (ratio.log2().floor() as u8).min(max)
        } else {
            0
        }
    };
    Precision {
        pos_shift: shift(pixel / step, COARSEST.pos_shift),
        heading_shift: shift(
            pixel / (HEADING_REACH_M * HEADING_STEP_RAD),
            COARSEST.heading_shift,
        ),
    }
}

/// What a viewer's linear updates cost: their bytes besides the headers
/// over their boids, and their headers (the batch's entry and the
/// update's own; a 1.4 or later viewer's are compact) over the updates. Each is a
/// sum that decays by [`COST_DECAY`] at each send that measures any, so
/// the estimate spans a second or two of sends: one send of unusual updates
/// (a column of boids crossing into the next cell at once) moves it a
/// little, where an average over the updates (hundreds a send) would
/// follow that one send.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    body: f32,
    boids: f32,
    headers: f32,
    updates: f32,
}

/// The share of the measured cost kept at each send that adds to it:
/// about 33 such sends (1.6 s at 30 broadcasts a second, where two sends
/// in three carry turns).
const COST_DECAY: f32 = 0.97;
/// How many boids and updates the starting guess weighs as.
const COST_PRIOR: f32 = 64.0;

impl Cost {
    fn new(bytes_per_boid: f32, overhead: f32) -> Self {
        Self {
            body: bytes_per_boid * COST_PRIOR,
            boids: COST_PRIOR,
            headers: overhead * COST_PRIOR,
            updates: COST_PRIOR,
        }
    }

    fn per_boid(&self) -> f32 {
        self.body / self.boids.max(1e-3)
    }

    fn overhead(&self) -> f32 {
        self.headers / self.updates.max(1e-3)
    }

    /// Adds one send's measurements (nothing when it measured none).
    fn add(&mut self, send: Cost) {
        if send.updates == 0.0 {
            return;
        }
        let d = COST_DECAY;
        self.body = d * self.body + send.body;
        self.boids = d * self.boids + send.boids;
        self.headers = d * self.headers + send.headers;
        self.updates = d * self.updates + send.updates;
    }
}

/// What a viewer knows of one cell, together: a send reads all three for
/// every cell of its full set, and a thousand viewers' state does not stay
/// in the cache (in three arrays a cell was three cache misses).
#[derive(Debug, Clone, Copy, Default)]
struct CellState {
    /// The frames of the cell the viewer holds.
    held: Held,
    /// The seq it was last sent in full at (0: never).
    last_sent: u64,
    /// The precision it is sent at (by its distance from the eye).
    precision: Precision,
    /// The part of it in view, to a sixteenth of the cell (what it is sent).
    crop: Crop,
    /// The boids of its last update.
    boids: u32,
}

/// The interest state of one viewer.
#[derive(Debug)]
pub struct ViewerInterest {
    view: View,
    /// Whose the linear encodings it makes are (its address).
    asker: Asker,
    /// The grid and box the state below refers to (None before the first send).
    frame: Option<(CellGrid, QuantBox)>,
    /// What the viewer knows of each cell.
    cells: Vec<CellState>,
    /// Cells in view with their weight (the share of the cell, or of its
    /// crop, inside the view over 1 + distance in cell edges), heaviest first.
    in_view: Vec<(u32, f32)>,
    /// Sends per second, measured (a moving average).
    send_hz: f32,
    /// The most sends per second the viewer asked for (`Subscribe`'s or
    /// `SetRate`'s `max_fps`): a page that slows down is sized for its
    /// new rate at once, not once the average has followed it down.
    max_fps: f32,
    /// Broadcasts per second, measured over [`BROADCAST_RATE_WINDOW`]
    /// (seqs are counted, so a late or skipped send does not move it).
    broadcast_hz: f32,
    /// Where the broadcast rate's window began: the time and the seq.
    rate_mark: Option<(Duration, u64)>,
    /// Whether `broadcast_hz` was measured yet (until then it is the
    /// assumed [`START_BROADCAST_HZ`], and no send is judged a gap by it).
    rate_measured: bool,
    /// Whether the last send was a paused server's.
    last_paused: bool,
    /// The seq of the last send.
    last_seq: u64,
    /// The full set's stride in half broadcasts (see [`Self::restride`]).
    halves: u64,
    /// The time of the last send.
    last_send: Option<Duration>,
    /// What this viewer's linear updates cost, measured.
    cost: Cost,
    /// Its turns are further apart than the cells' history, so every
    /// update is a full one, and the full set is sized at that cost.
    full_cost: bool,
    /// Whether each cell is in view.
    in_view_mark: Vec<bool>,
    /// When the summaries were last sent.
    last_summary: Option<Duration>,
    /// How often they are sent now, per second ([`Self::summary_rate`]).
    summary_hz: f32,
    /// The next batch tells the client to forget every cell (the stream
    /// is new, or the client sent `Resync`).
    reset_next: bool,
    /// The viewer's byte budget.
    pub budget: Budget,
    /// Most bytes the next batch may hold before its last update: what its
    /// socket may hold (`sockets.rs`; unbounded until set). The budget is
    /// held to it too, so the full set is sized for what goes out.
    batch_room: usize,
    /// The last `Interest` announced (None: the grid is new, announce it).
    announced: Option<(InterestInfo, Duration)>,
    /// This send's full-set cells with their priority (reused): whether
    /// the viewer holds a frame of it recent enough for a linear update,
    /// then staleness times weight.
    order: Vec<(bool, f32, u32)>,
    /// This send's cells to forget (reused).
    dropped: Vec<u32>,
    /// Whether each cell is in this send's full set (reused).
    full: Vec<bool>,
    /// The cells of the last send's full set (a held cell is one of them).
    full_cells: Vec<u32>,
    /// The buffer the next send's are listed in (reused).
    next_full_cells: Vec<u32>,
    /// The batch being built (handed over with each send: see
    /// [`RETAINED_BATCH_BYTES`]).
    buf: Vec<u8>,
    /// The cell update codings the viewer reads (by the protocol minor it
    /// subscribed with).
    codings: Codings,
    /// Whether its updates carry headings: not for a 1.6 viewer, which
    /// draws boids along their motion.
    headings: bool,
    /// Whether it reads compact batches (1.7).
    compact: bool,
    /// The slots to crop its cells with (None: never cropped).
    crop_slots: Option<std::sync::Arc<CropSlots>>,
    /// Its slot (its cells the view grazes are sent cropped to it) and
    /// the time its lease began.
    crop_slot: Option<(CropSlot, Duration)>,
    /// It waits for a slot (it was refused one for want of a free slot).
    crop_wait: Option<CropWait>,
    /// When it may next ask for a slot.
    crop_ask_at: Duration,
    /// Whether its view grazes a cell (only then does it want a slot).
    grazes: bool,
}

/// How long a viewer holds a crop slot before it renews it, or hands it
/// back when more viewers wait for one than were handed back for...
const CROP_LEASE: Duration = Duration::from_secs(30);
/// ...and how long it then waits before asking again (the others ask
/// every [`CROP_ASK_EVERY`], so one waiting takes it).
const CROP_REST: Duration = Duration::from_secs(5);
/// How often a viewer without a crop slot asks again.
const CROP_ASK_EVERY: Duration = Duration::from_secs(1);

/// The stream's grid and budget are announced again when the budget (or
/// the summaries' rate) moves by more than this fraction (at most once per
/// [`ANNOUNCE_EVERY`]).
const ANNOUNCE_MOVE: f64 = 0.1;
/// Least time between two budget announcements.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);

/// The most capacity a viewer's next batch starts with (its last batch's
/// size up to this): each batch is handed over whole, so a viewer that
/// stalls after a large one holds that batch alone, not a buffer as large.
const RETAINED_BATCH_BYTES: usize = 64 * 1024;

/// What one send produced.
#[derive(Debug, Default)]
pub struct Send {
    /// The batch, when there is anything to send.
    pub batch: Option<Bytes>,
    /// Cell updates in the batch.
    pub updates: usize,
}

impl ViewerInterest {
    /// A viewer looking at `view` (already checked), connected at `now`,
    /// that subscribed with protocol minor `minor`.
    pub fn new(view: View, now: Duration, minor: u16) -> Self {
        Self {
            view,
            asker: Asker::Viewer(None),
            frame: None,
            cells: Vec::new(),
            in_view: Vec::new(),
            send_hz: START_BROADCAST_HZ,
            max_fps: f32::INFINITY,
            broadcast_hz: START_BROADCAST_HZ,
            rate_mark: None,
            rate_measured: false,
            last_paused: false,
            last_seq: 0,
            halves: stride_for(START_BROADCAST_HZ, CADENCE_SLACK),
            last_send: None,
            cost: Cost::new(
                start_bytes_per_boid(minor),
                update_overhead(minor >= COMPACT_BATCH_MINOR),
            ),
            full_cost: false,
            in_view_mark: Vec::new(),
            last_summary: None,
            summary_hz: SUMMARY_HZ,
            reset_next: true,
            budget: Budget::new(view.budget_bytes_per_s, now),
            batch_room: usize::MAX,
            announced: None,
            order: Vec::new(),
            dropped: Vec::new(),
            full: Vec::new(),
            full_cells: Vec::new(),
            next_full_cells: Vec::new(),
            buf: Vec::new(),
            codings: Codings::for_minor(minor),
            headings: minor < NO_HEADING_MINOR,
            compact: minor >= COMPACT_BATCH_MINOR,
            crop_slots: None,
            crop_slot: None,
            crop_wait: None,
            crop_ask_at: Duration::ZERO,
            grazes: false,
        }
    }

    /// The slots its cells may be cropped with (`engine/crop.rs`): it
    /// takes one when free (asking again every [`CROP_ASK_EVERY`]) and
    /// holds it for [`CROP_LEASE`] at a time. Call after
    /// [`Self::set_address`].
    pub fn set_crop_slots(&mut self, slots: std::sync::Arc<CropSlots>) {
        self.crop_slots = Some(slots);
    }

    /// Whether its cells are cropped to its view now.
    pub fn crops(&self) -> bool {
        self.crop_slot.is_some()
    }

    /// Takes a crop slot when it has none, its view grazes a cell and it
    /// may ask (refused for want of a free slot, it waits for one); at the
    /// end of a lease renews it, or hands it back when more viewers wait
    /// than slots were handed back for them; hands it back when its view
    /// no longer grazes any cell. True when it took or gave one back (its
    /// crops change).
    fn crop_turn(&mut self, now: Duration) -> bool {
        let Some(slots) = self.crop_slots.clone() else {
            return false;
        };
        if let Some((_, since)) = &mut self.crop_slot {
            if !self.grazes {
                self.crop_slot = None;
                self.crop_ask_at = now + CROP_ASK_EVERY;
                return true;
            }
            if now.saturating_sub(*since) < CROP_LEASE {
                return false;
            }
            if !slots.hand_back() {
                *since = now;
                return false;
            }
            self.crop_slot = None;
            self.crop_ask_at = now + CROP_REST;
            return true;
        }
        if !self.grazes {
            self.crop_wait = None;
            return false;
        }
        if now < self.crop_ask_at {
            return false;
        }
        self.crop_ask_at = now + CROP_ASK_EVERY;
        match slots.ask(self.asker) {
            Asked::Slot(slot) => {
                self.crop_wait = None;
                self.crop_slot = Some((slot, now));
                true
            }
            Asked::Full => {
                if self.crop_wait.is_none() {
                    self.crop_wait = Some(slots.wait());
                }
                false
            }
            Asked::NetworkFull => {
                self.crop_wait = None;
                false
            }
        }
    }

    /// The address (group) the viewer connects from: the linear encodings
    /// it makes count against its network, an IPv4 /24 or an IPv6 /48
    /// (`engine::interest::Asker::viewer`).
    pub fn set_address(&mut self, address: std::net::IpAddr) {
        self.asker = Asker::viewer(address);
    }

    /// The view moved (already checked).
    pub fn set_view(&mut self, view: View) {
        self.view = view;
        self.budget.declare(view.budget_bytes_per_s);
        if let Some((grid, quant)) = self.frame {
            self.locate(grid, quant);
        }
    }

    /// The client dropped every cell (it sent `Resync`): start over, and
    /// say so in the next batch (batches it gets before that one were
    /// built for the cells it no longer holds, and it ignores them).
    pub fn resync(&mut self) {
        for c in &mut self.cells {
            (c.held, c.last_sent) = ([None, None], 0);
        }
        self.reset_next = true;
    }

    /// What the viewer is told about the stream now.
    pub fn info(&self) -> Option<InterestInfo> {
        let (grid, quant) = self.frame?;
        Some(InterestInfo {
            grid,
            quant,
            budget_bytes_per_s: self.budget.rate(),
            summary_hz: self.summary_hz,
        })
    }

    /// The `Interest` message to send now, if any: after a new grid, or
    /// when the budget moved by more than [`ANNOUNCE_MOVE`].
    pub fn announcement(&mut self, now: Duration) -> Option<InterestInfo> {
        let info = self.info()?;
        let due = match self.announced {
            None => true,
            Some((last, at)) => {
                let was = f64::from(last.budget_bytes_per_s);
                let moved = (f64::from(info.budget_bytes_per_s) - was).abs() > ANNOUNCE_MOVE * was
                    || f64::from((info.summary_hz - last.summary_hz).abs())
                        > ANNOUNCE_MOVE * f64::from(last.summary_hz);
                last.grid != info.grid
                    || last.quant != info.quant
                    || (moved && now.saturating_sub(at) >= ANNOUNCE_EVERY)
            }
        };
        if due {
            self.announced = Some((info, now));
        }
        due.then_some(info)
    }

    /// The cells in view and how near each is to the camera.
    fn locate(&mut self, grid: CellGrid, quant: QuantBox) {
        let v = &self.view;
        let eye = v
            .eye
            .unwrap_or(std::array::from_fn(|a| 0.5 * (v.min[a] + v.max[a])));
        let edge = {
            let (lo, hi) = grid.bounds_m(0, &quant);
            let e: f32 = (0..3).map(|a| hi[a] - lo[a]).sum();
            (e / 3.0).max(1e-3)
        };
        self.in_view.clear();
        self.grazes = false;
        self.in_view_mark.clear();
        self.in_view_mark.resize(grid.len(), false);
        self.cells.resize(grid.len(), CellState::default());
        for c in 0..grid.len() as u32 {
            let (lo, hi) = grid.bounds_m(c, &quant);
            // The distance to the cell's nearest point decides its precision.
            let near2: f32 = (0..3)
                .map(|a| {
                    let d = (lo[a] - eye[a]).max(eye[a] - hi[a]).max(0.0);
                    d * d
                })
                .sum();
            let p = precision_at(near2.sqrt(), &quant);
            self.cells[c as usize].precision = if self.headings {
                p
            } else {
                p.without_heading()
            };
            if (0..3).any(|a| hi[a] < v.min[a] || lo[a] > v.max[a]) {
                self.cells[c as usize].crop = Crop::WHOLE;
                continue;
            }
            let crop = Crop::of_view(&grid, &quant, c, v.min, v.max);
            self.grazes |= !crop.is_whole();
            let crop = if self.crop_slot.is_some() {
                crop
            } else {
                Crop::WHOLE
            };
            self.cells[c as usize].crop = crop;
            let d2: f32 = (0..3)
                .map(|a| {
                    let centre = 0.5 * (lo[a] + hi[a]);
                    (centre - eye[a]) * (centre - eye[a])
                })
                .sum();
            // The share of the cell's crop inside the view: a crop a lattice
            // step wider than the view shows a little less than it costs.
            let inside: f32 = (0..3)
                .map(|a| {
                    let (len, view_len) = (hi[a] - lo[a], v.max[a] - v.min[a]);
                    if len <= 0.0 || view_len <= 0.0 {
                        return 1.0;
                    }
                    let overlap = hi[a].min(v.max[a]) - lo[a].max(v.min[a]);
                    (overlap / len).clamp(0.05, 1.0)
                })
                .product::<f32>()
                / crop.share();
            self.in_view
                .push((c, inside.min(1.0) / (1.0 + d2.sqrt() / edge)));
            self.in_view_mark[c as usize] = true;
        }
        self.in_view
            .sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    }

    /// How often summaries of `bytes` bytes are sent: [`SUMMARY_HZ`], or
    /// less where that would take more than [`SUMMARY_SHARE`] of the budget.
    fn summary_rate(&self, bytes: usize) -> f32 {
        let bytes = bytes as f32;
        if bytes <= 0.0 {
            return SUMMARY_HZ;
        }
        SUMMARY_HZ.min(SUMMARY_SHARE * self.budget.rate() as f32 / bytes)
    }

    /// Chooses the full set's stride (in half broadcasts: 2 every
    /// broadcast, 3 two in three, 4 every other one) for the measured
    /// broadcast rate: the longest that keeps the set at [`FULL_HZ`] or
    /// more, within [`CADENCE_SLACK`]; once chosen it is kept until the
    /// rate falls [`KEEP_SLACK`] short of it.
    fn restride(&mut self) {
        let taken = stride_for(self.broadcast_hz, CADENCE_SLACK);
        let kept = stride_for(self.broadcast_hz, KEEP_SLACK);
        if taken > self.halves {
            self.halves = taken;
        } else if kept < self.halves {
            self.halves = kept;
        }
    }

    /// The rate the full set is updated at: its turns per second, or this
    /// viewer's sends per second (measured, and no more than it asked
    /// for) when fewer; at least
    /// [`MIN_FULL_HZ`]. A send may spend the time since the last one
    /// (`budget.rs`), so a stream that sends twice a second carries a set
    /// sized for two updates a second (sized for five, as it was, it held
    /// 1489 of the 3511 boids its budget paid for).
    fn full_hz(&self) -> f32 {
        let turns = 2.0 * self.broadcast_hz / self.halves as f32;
        turns.min(self.send_hz).min(self.max_fps).max(MIN_FULL_HZ)
    }

    /// The most sends per second the viewer asked for.
    pub fn set_max_fps(&mut self, fps: u32) {
        self.max_fps = fps.max(1) as f32;
    }

    /// Marks the full set in `full`: the heaviest cells in view whose
    /// updates at [`Self::full_hz`] fit the budget (held ones with some
    /// slack), and at least the heaviest cell that holds boids.
    fn choose_full_set(&self, set: &CellSet, full: &mut Vec<bool>, chosen: &mut Vec<u32>) {
        full.clear();
        chosen.clear();
        full.resize(self.cells.len(), false);
        let summaries = set.now.summary_bytes(self.compact) as f32 * self.summary_hz;
        // Every send's batch header (about 2 % of the least budget).
        let header = if self.compact {
            COMPACT_BATCH_HEADER_BYTES
        } else {
            BATCH_HEADER_BYTES
        };
        let headers = header as f32 * self.send_hz.min(self.broadcast_hz);
        let full_hz = self.full_hz();
        let allowance =
            (FULL_SHARE * self.budget.rate() as f32 - summaries - headers).max(0.0) / full_hz;
        let seq = set.seq();
        // A viewer that takes its cells' turns further apart than the
        // cells' history reaches (a page slowed to two frames a second) is
        // sent every update in full: sized at a linear update's cost, its
        // set was about seven times what each send could reach.
        let (overhead, per_boid) = if self.full_cost {
            (
                update_overhead(self.compact),
                full_bytes_per_boid(self.headings) as f32,
            )
        } else {
            (self.cost.overhead(), self.cost.per_boid())
        };
        let mut used = 0.0;
        for &(c, _) in &self.in_view {
            // A cropped cell's boids: as many as its last update held when
            // it was cropped alike; the whole cell's when it was last sent
            // whole (a crop refused at the cap costs that); else its share
            // of the cell's (counting them is a pass over the cell per
            // viewer).
            let cell = &self.cells[c as usize];
            let count = set.now.counts[c as usize] as f32;
            // An empty cell is not sent (it is dropped); an empty crop of
            // a cell that holds boids is, as any held cell (skipped, it
            // was dropped and sent again at every other send).
            if count == 0.0 {
                continue;
            }
            let boids = match cell.held[0] {
                _ if cell.crop.is_whole() => count,
                Some((_, _, crop)) if crop == cell.crop => cell.boids as f32,
                Some((_, _, crop)) if crop.is_whole() => count,
                _ => count * cell.crop.share(),
            };
            let cost = overhead + boids * per_boid;
            // Only a cell held recently enough for a linear update keeps its
            // place with the slack: a stale one needs a full update, as a
            // joining one does.
            let held = self.cells[c as usize].held[0].is_some_and(|(s, ..)| recent(s, seq));
            let limit = if held {
                allowance * HYSTERESIS
            } else {
                allowance
            };
            if used > 0.0 && used + cost > limit {
                break; // heaviest first: no lighter cell jumps the queue
            }
            full[c as usize] = true;
            chosen.push(c);
            used += cost;
        }
    }

    /// Caps the next batches at `room` bytes (an update that would pass
    /// it waits), and the budget's sends with them: a room cutting batches
    /// the full set was not sized for left most of a view's cells stale
    /// for good (the held ones' linear updates went first and filled it
    /// every time).
    pub fn set_batch_room(&mut self, room: usize) {
        self.batch_room = room;
        self.budget.cap_burst(room);
    }

    /// This send's batch for broadcast `set` at connection time `now`;
    /// `paused`: the server is paused (its broadcasts are steps and edits,
    /// not its rate).
    pub fn send(&mut self, set: &CellSet, now: Duration, paused: bool) -> Send {
        let mut out = Send::default();
        let frames = &set.now;
        let here = (frames.grid, frames.quant);
        if self.frame != Some(here) {
            self.frame = Some(here);
            let n = frames.grid.len();
            self.cells = vec![CellState::default(); n];
            self.full_cells.clear();
            self.locate(frames.grid, frames.quant);
            self.last_summary = None;
            self.announced = None;
            self.reset_next = true;
        }
        if self.crop_turn(now) {
            self.locate(frames.grid, frames.quant);
        }
        self.budget.refill(now);
        let seq = set.seq();
        // Summaries when due: the whole flock's shape, always.
        self.summary_hz = self.summary_rate(frames.summary_bytes(self.compact));
        let summaries_due = self
            .last_summary
            .is_none_or(|t| now.saturating_sub(t).as_secs_f32() >= 1.0 / self.summary_hz);
        let summaries: &[_] = if summaries_due {
            self.last_summary = Some(now);
            &frames.summaries
        } else {
            &[]
        };
        // The full set; held cells outside it are forgotten.
        // A paused server's sends, and the first after them (its interval
        // spans the pause), are gaps; so is a long silence against a
        // measured rate. Only against a measured rate: a server slower
        // than the assumed one from the start (a million boids, two
        // broadcasts a second) read as paused at every send and its rate
        // was never measured (its viewers held a tenth of what their
        // budget paid for).
        let mut gap = paused || self.last_paused;
        self.last_paused = paused;
        if let Some(last) = self.last_send {
            let since = now.saturating_sub(last);
            let dt = since.as_secs_f32();
            let expected = dt * self.broadcast_hz;
            gap |= self.rate_measured
                && since > GAP
                && (seq.saturating_sub(self.last_seq) as f32) < 0.5 * expected;
            if dt > 0.0 && !gap {
                self.send_hz = 0.9 * self.send_hz + 0.1 * (1.0 / dt).min(1000.0);
            }
        }
        self.last_send = Some(now);
        self.last_seq = seq;
        match self.rate_mark {
            Some((t0, s0)) if seq >= s0 && !gap => {
                let dt = now.saturating_sub(t0);
                if dt >= BROADCAST_RATE_WINDOW {
                    self.broadcast_hz = (seq - s0) as f32 / dt.as_secs_f32();
                    self.rate_measured = true;
                    self.rate_mark = Some((now, seq));
                    self.restride();
                }
            }
            _ => self.rate_mark = Some((now, seq)),
        }
        // Turns further apart than the cells' history: every update full
        // (with a margin back, so a rate near it does not flip the set).
        let per_turn = self.broadcast_hz / self.full_hz();
        let history = HISTORY as f32;
        self.full_cost = per_turn
            > if self.full_cost {
                0.8 * history
            } else {
                history
            };
        let mut full = std::mem::take(&mut self.full);
        let mut chosen = std::mem::take(&mut self.next_full_cells);
        self.choose_full_set(set, &mut full, &mut chosen);
        self.dropped.clear();
        self.order.clear();
        let halves = self.halves;
        let now_turn = turn(seq, halves);
        for &(c, weight) in &self.in_view {
            let cell = &self.cells[c as usize];
            let last = cell.last_sent;
            // Off its turn a cell waits (one it missed goes now).
            if full[c as usize] && (last == 0 || turn(last, halves) != now_turn) {
                let age = seq.saturating_sub(last).min(1 << 20) as f32;
                let recent = cell.held[0].is_some_and(|(s, ..)| recent(s, seq));
                self.order.push((recent, age * weight, c));
            }
        }
        // A held cell was in the last full set (cells are sent only from
        // it): the two sets are compared, not every cell's held frames
        // (a thousand viewers' held frames do not stay in the cache).
        for &c in &self.full_cells {
            let cell = &mut self.cells[c as usize];
            if !full[c as usize] && cell.held[0].is_some() {
                cell.held = [None, None];
                self.dropped.push(c);
            }
        }
        // Found in weight order: the batch lists them ascending.
        self.dropped.sort_unstable();
        self.full = full;
        self.next_full_cells = std::mem::replace(&mut self.full_cells, chosen);
        // The cells held recently enough for a linear update go first,
        // then those that need a full one (joining the set, or held too
        // long ago), each stalest and heaviest first. A full update costs
        // ten times a linear one: a set too large for the budget (sized
        // before the updates' cost was measured) once spent every send on
        // full updates, its held cells went stale and needed full ones too,
        // and no update was ever linear (at a million boids, 2000 a cell,
        // 10.6 bytes a boid and no cell at 20 Hz).
        self.order
            .sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
        let mut flags = 0;
        if summaries_due {
            flags |= FLAG_COMPLETE_SUMMARIES;
        }
        if std::mem::take(&mut self.reset_next) {
            flags |= FLAG_RESET;
        }
        if self.compact {
            let coded: &[u8] = if summaries_due {
                &frames.compact_summaries
            } else {
                &[]
            };
            // Sorted above, and without duplicates (the full set's cells
            // are): strictly ascending.
            begin_compact_batch(
                frames.tick,
                summaries.len(),
                coded,
                flags,
                &self.dropped,
                &mut self.buf,
            )
            .expect("dropped cells ascending");
        } else {
            begin_batch(frames.tick, summaries, flags, &self.dropped, &mut self.buf);
        }
        self.budget.spend(self.buf.len());
        let mut measured = Cost::default();
        for &(_, _, c) in &self.order {
            if !self.budget.can_send() {
                break;
            }
            let cell = &self.cells[c as usize];
            let Some(update) = set.update_for(
                c,
                cell.held,
                cell.precision,
                cell.crop,
                self.codings,
                self.asker,
            ) else {
                continue;
            };
            let Shared { bytes, batched } = &update.shared;
            // An update that would take the batch past its socket's room
            // waits (a smaller one may fit): a batch never passes it, so
            // neither does what the pool counts.
            let most = if self.compact {
                MAX_RECORD_FRAMING + batched.bytes().len() + batched.rest(bytes).len()
            } else {
                UPDATE_HEADER_BYTES + bytes.len()
            };
            if most > self.batch_room.saturating_sub(self.buf.len()) {
                continue;
            }
            // The bytes the batch gains besides the update's fields, and in all.
            let (overhead, added) = if self.compact {
                match push_compact_update(c, batched, bytes, frames.tick, &mut self.buf) {
                    Ok(sizes) => sizes,
                    Err(e) => {
                        // Our own updates, of this broadcast: a bug.
                        debug_assert!(false, "{e}");
                        continue;
                    }
                }
            } else {
                push_update(c, bytes, &mut self.buf);
                (
                    UPDATE_HEADER_BYTES + batched.standalone_len(),
                    UPDATE_HEADER_BYTES + bytes.len(),
                )
            };
            self.budget.spend(added);
            let boids = update.boids;
            if update.linear && boids >= 16 {
                // A linear update: learn what a boid and the headers cost.
                measured.body += (added - overhead) as f32;
                measured.boids += boids as f32;
                measured.headers += overhead as f32;
                measured.updates += 1.0;
            }
            let cell = &mut self.cells[c as usize];
            (cell.held, cell.last_sent) = (update.held, seq);
            cell.boids = boids.min(u32::MAX as usize) as u32;
            out.updates += 1;
        }
        self.cost.add(measured);
        if out.updates > 0 || flags != 0 || !self.dropped.is_empty() {
            // Handed over, not copied: while the send waits on the socket
            // (up to the stall timeout) only the batch is held.
            let next = Vec::with_capacity(self.buf.len().min(RETAINED_BATCH_BYTES));
            out.batch = Some(Bytes::from(std::mem::replace(&mut self.buf, next)));
        } else if self.buf.capacity() > RETAINED_BATCH_BYTES {
            self.buf = Vec::new();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use starling_protocol::interest::CellMirror;
    use starling_protocol::{Frame, PROTOCOL_MINOR, QuantBox};

    use super::*;
    use crate::engine::interest::CellBuilder;
    use crate::http::ws::budget::MAX_BURST_BYTES;
    use crate::telemetry::Telemetry;

    /// 4000 boids spread evenly over a 100 × 100 × 50 m world, drifting in x.
    fn frame(tick: u64) -> Frame {
        let quant = QuantBox::around_world([100.0, 100.0, 50.0], 3);
        let n = 4000u32;
        let mut f = Frame {
            tick,
            quant: Some(quant),
            ..Frame::default()
        };
        for id in 0..n {
            let p = [
                (id % 20) as f32 * 5.0 + tick as f32 * 0.05,
                ((id / 20) % 20) as f32 * 5.0,
                (id / 400) as f32 * 5.0,
            ];
            f.ids.push(id);
            f.pos.extend_from_slice(&quant.quantize(p));
            f.heading.extend_from_slice(&[200, 128]);
        }
        f
    }

    /// Runs a viewer for two seconds at 30 sends a second: what it held at
    /// the end, the boids it held in full, and the viewer.
    fn run(view: View) -> (CellMirror, usize, ViewerInterest) {
        let mut vi = [ViewerInterest::new(view, Duration::ZERO, PROTOCOL_MINOR)];
        let (mut mirrors, _, _) = serve(&mut vi, (1..=60).map(at_hz(30.0)), |_, _, _| {});
        let m = mirrors.remove(0);
        let held = held_boids(&m);
        let [vi] = vi;
        (m, held, vi)
    }

    #[test]
    fn the_budget_decides_how_much_of_the_view_is_held_in_full_nearest_first() {
        let (small, held_small, viewer) = run(whole_view(40_000));
        let (large, held_large, _) = run(whole_view(2_000_000));
        // Both see the whole flock as summaries.
        for m in [&small, &large] {
            assert_eq!(m.summaries().map(|s| s.count).sum::<u32>(), 4000);
        }
        assert!(held_small > 0, "the nearest cell is always held");
        assert!(held_large > 3 * held_small, "{held_small} vs {held_large}");
        assert_eq!(held_large, 4000, "a large budget holds the whole view");
        // The small budget holds the heaviest cells in view (nearest the
        // eye at the origin, most inside the view): the first of them in
        // weight order, a held cell kept by the hysteresis aside.
        let held: Vec<u32> = small.held_cells().collect();
        let by_weight: Vec<u32> = viewer
            .in_view
            .iter()
            .map(|&(c, _)| c)
            .filter(|&c| large.cell(c).is_some_and(|f| !f.is_empty()))
            .collect();
        let first = &by_weight[..(held.len() + 1).min(by_weight.len())];
        let outside: Vec<_> = held.iter().filter(|c| !first.contains(c)).collect();
        assert!(
            outside.len() <= 1,
            "held {held:?}, heaviest first {by_weight:?}"
        );
        assert!(
            held.len() < by_weight.len() / 2,
            "{} of {} cells held",
            held.len(),
            by_weight.len()
        );
        let grid = small.grid();
        assert!(
            held.iter().all(|&c| grid.coords(c).iter().all(|&i| i <= 6)),
            "a far cell held: {:?}",
            held.iter().map(|&c| grid.coords(c)).collect::<Vec<_>>()
        );
    }

    /// Serves `vi` `broadcasts` broadcasts of `flock` (in a `world` of
    /// three dimensions, ticking twice a broadcast) at 30 a second, on a
    /// link that drains whatever is sent; `on_batch(seq, batch)` sees each
    /// batch once the viewer's mirror applied it. Returns the mirror.
    fn drive(
        vi: &mut ViewerInterest,
        world: [f32; 3],
        flock: impl Fn(u64) -> Frame,
        broadcasts: u64,
        mut on_batch: impl FnMut(u64, &[u8]),
    ) -> CellMirror {
        let (grid, quant) = (
            CellGrid::for_world(world, 3),
            QuantBox::around_world(world, 3),
        );
        let (tel, mut b) = (Arc::new(Telemetry::default()), CellBuilder::default());
        let mut m = CellMirror::new(grid, quant);
        for seq in 1..=broadcasts {
            let now = Duration::from_secs_f64(seq as f64 / 30.0);
            let set = b.build(seq, &flock(2 * seq), world, 3, &tel).unwrap();
            if let Some(batch) = vi.send(&set, now, false).batch {
                vi.budget.sent(batch.len(), Duration::ZERO, now);
                m.apply(&batch).unwrap();
                on_batch(seq, &batch);
            }
        }
        m
    }

    #[test]
    fn a_viewer_sending_once_a_second_on_a_fast_link_gets_at_most_the_burst_a_batch() {
        // 400,000 boids (4.8 MB in full) in the test world, no budget
        // declared, one send a second, a link that drains whatever is
        // sent: the drain estimate doubles past what one send may carry.
        let world = [100.0, 100.0, 50.0];
        let quant = QuantBox::around_world(world, 3);
        let flock = |tick: u64| {
            let mut f = Frame {
                tick,
                quant: Some(quant),
                ..Frame::default()
            };
            for id in 0..400_000u32 {
                // Jittered, so linear updates cost several bytes a boid
                // and the whole flock's would not fit one send.
                let h = (u64::from(id) << 32 | tick).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let j = |k: u32| ((h >> (56 - 8 * k)) & 0xff) as f32 / 255.0 - 0.5;
                let p = [
                    (id % 50) as f32 * 2.0 + j(0),
                    ((id / 50) % 50) as f32 * 2.0 + j(1),
                    (id / 2500) as f32 * 0.3 + 0.2 * j(2),
                ];
                f.ids.push(id);
                f.pos.extend_from_slice(&quant.quantize(p));
                f.heading.extend_from_slice(&[200, 128]);
            }
            f
        };
        let view = View {
            budget_bytes_per_s: None,
            ..whole_view(0)
        };
        let mut vi = ViewerInterest::new(view, Duration::ZERO, PROTOCOL_MINOR);
        vi.set_max_fps(1);
        let (tel, mut b) = (Arc::new(Telemetry::default()), CellBuilder::default());
        let mut m: Option<CellMirror> = None;
        let (mut biggest, mut slack) = (0, 0);
        for seq in 1..=14 {
            let now = Duration::from_secs(seq);
            let set = b.build(seq, &flock(2 * seq), world, 3, &tel).unwrap();
            // Past the tokens: the summaries, and one update into debt
            // (at most a cell's in full).
            let most = set.now.counts.iter().max().copied().unwrap_or(0) as usize;
            slack = slack.max(
                set.now.summary_bytes(true)
                    + COMPACT_BATCH_HEADER_BYTES
                    + CELL_UPDATE_HEADER_BYTES
                    + full_bytes_per_boid(true) * most,
            );
            let m = m.get_or_insert_with(|| CellMirror::new(set.now.grid, set.now.quant));
            if let Some(batch) = vi.send(&set, now, false).batch {
                vi.budget.sent(batch.len(), Duration::ZERO, now);
                m.apply(&batch).unwrap();
                biggest = biggest.max(batch.len());
            }
            assert!(vi.buf.capacity() <= RETAINED_BATCH_BYTES);
            // Held cells' linear updates go before joining cells' full
            // ones, so those held are kept up within the burst.
            if seq >= 10 {
                let stale = stale_cells(m, set.now.tick);
                assert!(stale <= 1, "{stale} held cells not updated at send {seq}");
            }
        }
        // The link drains more than one send a second may carry: the
        // viewer is told, and its set sized for, what can go out.
        let burst = MAX_BURST_BYTES as usize;
        assert!(
            vi.budget.rate() as usize <= burst + burst / 50,
            "a budget of {} B/s",
            vi.budget.rate()
        );
        assert!(biggest <= burst + slack, "a batch of {biggest} bytes");
        assert!(
            biggest >= burst / 2,
            "the sends use what they may carry: {biggest}"
        );
        assert!(m.as_ref().is_some_and(|m| held_boids(m) > 0));
        // It turns to a corner: its batches shrink.
        vi.set_view(View {
            max: [5.0, 5.0, 5.0],
            ..view
        });
        for seq in 15..=16 {
            let set = b.build(seq, &flock(2 * seq), world, 3, &tel).unwrap();
            let batch = vi.send(&set, Duration::from_secs(seq), false).batch;
            let len = batch.as_ref().map_or(0, |b| b.len());
            assert!(len < RETAINED_BATCH_BYTES, "{len}");
            if let Some(batch) = batch {
                m.as_mut().unwrap().apply(&batch).unwrap();
            }
        }
        // Back to the whole view, held cells filled again; then its
        // socket's pool has no room beyond its floor (`sockets.rs`): the
        // batches never pass it, and the viewer is kept up with the cells
        // that fit: none it holds goes stale (cut without the set
        // shrinking, most of them did). Then the pool has room again, and
        // the view fills again.
        vi.set_view(view);
        let room = crate::http::ws::sockets::INTEREST_FLOOR;
        for seq in 17..=36 {
            let now = Duration::from_secs(seq);
            let tight = (21..=32).contains(&seq);
            vi.set_batch_room(if tight { room } else { usize::MAX });
            let set = b.build(seq, &flock(2 * seq), world, 3, &tel).unwrap();
            let batch = vi.send(&set, now, false).batch.expect("a batch");
            vi.budget.sent(batch.len(), Duration::ZERO, now);
            let m = m.as_mut().unwrap();
            m.apply(&batch).unwrap();
            if seq == 20 || seq == 36 {
                assert!(
                    m.held_cells().count() > 200,
                    "{} cells held at send {seq}",
                    m.held_cells().count()
                );
            }
            if tight {
                assert!(
                    (room / 2..=room).contains(&batch.len()),
                    "a batch of {} bytes in a room of {room}",
                    batch.len()
                );
            }
            if (26..=32).contains(&seq) {
                let stale = stale_cells(m, set.now.tick);
                assert!(stale <= 1, "{stale} held cells not updated at send {seq}");
                assert!(held_boids(m) > 0);
            }
        }
        // The room holds on its own, whatever the budget allows (a set
        // kept within its hysteresis may outrun the budget by an update).
        vi.set_batch_room(room);
        vi.budget.cap_burst(usize::MAX);
        let set = b.build(37, &flock(74), world, 3, &tel).unwrap();
        let batch = vi.send(&set, Duration::from_secs(37), false).batch.unwrap();
        assert!(
            (room / 2..=room).contains(&batch.len()),
            "a batch of {} bytes in a room of {room}",
            batch.len()
        );
    }

    #[test]
    fn cells_of_many_boids_on_the_least_budget_are_kept_up_linearly() {
        // 48,000 boids, about 95 a cell, on the least budget: a full update
        // costs ten times a linear one. Cells joining the set took the
        // sends' budget for their full updates before the held cells'
        // linear ones, which went stale and needed full updates too (at a
        // million boids, 2000 a cell, no update was ever linear).
        use starling_protocol::interest::BatchView;
        use starling_protocol::limits::MIN_VIEW_BUDGET;
        let world = [100.0, 100.0, 50.0];
        let (grid, quant) = (
            CellGrid::for_world(world, 3),
            QuantBox::around_world(world, 3),
        );
        let flock = |tick: u64| {
            let mut f = Frame {
                tick,
                quant: Some(quant),
                ..Frame::default()
            };
            for id in 0..48_000u32 {
                let p = [
                    (id % 40) as f32 * 2.5 + 0.3 + tick as f32 * 0.05,
                    ((id / 40) % 40) as f32 * 2.5 + 0.3,
                    (id / 1600) as f32 * 1.6 + 0.3,
                ];
                f.ids.push(id);
                f.pos.extend_from_slice(&quant.quantize(p));
                f.heading.extend_from_slice(&[200, 128]);
            }
            f
        };
        let mut vi = ViewerInterest::new(
            View {
                budget_bytes_per_s: Some(MIN_VIEW_BUDGET),
                ..whole_view(0)
            },
            Duration::ZERO,
            PROTOCOL_MINOR,
        );
        let (mut linear, mut full) = (0, 0);
        // Five seconds.
        let m = drive(&mut vi, world, flock, 150, |seq, batch| {
            if seq > 60 {
                let view = BatchView::parse(batch, &grid, &quant).unwrap();
                for (_, u) in view.updates() {
                    match view.update(u).unwrap().base_tick {
                        Some(_) => linear += 1,
                        None => full += 1,
                    }
                }
            }
        });
        // Deterministic (simulated time): about 440 linear and 10 full;
        // with the cells needing full updates first, 245 and 21.
        assert!(m.held_cells().count() > 0);
        assert!(
            linear > 20 * full,
            "{linear} linear and {full} full updates in the last three seconds"
        );
    }

    #[test]
    fn a_wide_flat_world_on_the_least_budget_still_gets_cells_within_it() {
        // 2000 × 2000 × 30 m: thousands of cells of one boid each, whose
        // summaries twice a second took more than the least budget (with
        // 1024 cells of the 20-byte summaries, 41 kB/s): the viewer held no
        // cell and was sent more than its budget.
        use starling_protocol::limits::MIN_VIEW_BUDGET;
        let world = [2000.0, 2000.0, 30.0];
        let grid = CellGrid::for_world(world, 3);
        let quant = QuantBox::around_world(world, 3);
        let flock = |tick: u64| {
            let mut f = Frame {
                tick,
                quant: Some(quant),
                ..Frame::default()
            };
            for c in 0..grid.len() as u32 {
                let (lo, hi) = grid.bounds_m(c, &quant);
                let centre: [f32; 3] = std::array::from_fn(|a| 0.5 * (lo[a] + hi[a]));
                f.ids.push(c);
                f.pos.extend_from_slice(&quant.quantize(centre));
                f.heading.extend_from_slice(&[200, 128]);
            }
            f
        };
        let view = View {
            min: [0.0; 3],
            max: world,
            eye: Some([0.0; 3]),
            budget_bytes_per_s: Some(MIN_VIEW_BUDGET),
        };
        // Their summaries twice a second would take more than their share.
        let set = CellBuilder::default()
            .build(1, &flock(2), world, 3, &Arc::new(Telemetry::default()))
            .unwrap();
        let summaries = set.now.summary_bytes(true) as f32 * SUMMARY_HZ;
        assert!(
            summaries > SUMMARY_SHARE * MIN_VIEW_BUDGET as f32,
            "{summaries} B/s"
        );
        let mut vi = ViewerInterest::new(view, Duration::ZERO, PROTOCOL_MINOR);
        let mut late_bytes = 0usize;
        // Eight seconds.
        let m = drive(&mut vi, world, flock, 240, |seq, batch| {
            if seq > 60 {
                late_bytes += batch.len();
            }
        });
        let summaries = m.summaries().map(|s| s.count).sum::<u32>();
        assert_eq!(summaries, 1024, "the whole flock as summaries");
        assert!(held_boids(&m) > 0, "no cell held in full");
        // The last six seconds within the budget (and a burst).
        let allowed = 6.0 * MIN_VIEW_BUDGET as f32 * 1.1 + 0.2 * MIN_VIEW_BUDGET as f32;
        assert!(late_bytes as f32 <= allowed, "{late_bytes} bytes in 6 s");
        assert!(vi.info().unwrap().summary_hz < SUMMARY_HZ);
    }

    #[test]
    fn a_viewer_too_slow_for_deltas_sizes_its_full_set_by_what_its_updates_cost() {
        // Two sends a second (a page slowed to 2 frames/s): its held frames
        // are always older than the cells' history, so every update is a
        // full one (12 bytes a boid). Its full set was sized at what a
        // linear update costs (1.5 to 2 bytes a boid), about seven times
        // too large: each send reached a part of it, and the cells it held
        // were seconds stale.
        let mut vi = [watching(40_000)];
        let sends = (1..=900).filter(|s| s % 15 == 0).map(at_hz(30.0));
        let (m, updates, _) = serve(&mut vi, sends, |_, _, _| {});
        assert!(held_boids(&m[0]) > 0);
        // The last twenty sends (ten seconds): each cell held throughout
        // at 18 of them or more (a cell joining the set goes first, and
        // may push one held cell's update to the next send); 14 before.
        assert_updated_at_least(&updates[0], 600, 900, 18);
        // A viewer that asked for 2 frames a second is sized for them from
        // its first sends, not once the measured rate has come down (about
        // ten seconds from the assumed 30).
        let mut vi = [watching(40_000)];
        vi[0].set_max_fps(2);
        let sends = (1..=300).filter(|s| s % 15 == 0).map(at_hz(30.0));
        let (_, updates, _) = serve(&mut vi, sends, |_, _, _| {});
        assert_updated_at_least(&updates[0], 60, 300, 14);
    }

    /// Each cell held at `from` (updated at one of the two sends, 15
    /// broadcasts apart, up to it) and at the last send (`last`) was
    /// updated at `least` of the sends after `from` or more; more than five
    /// cells were.
    fn assert_updated_at_least(
        updates: &std::collections::HashMap<u32, Vec<u64>>,
        from: u64,
        last: u64,
        least: usize,
    ) {
        let mut checked = 0;
        for (c, seqs) in updates {
            let held_at_from = seqs.iter().any(|&s| s <= from && s + 30 > from);
            if held_at_from && seqs.last() == Some(&last) {
                let late = seqs.iter().filter(|&&s| s > from).count();
                assert!(late >= least, "cell {c}: {seqs:?}");
                checked += 1;
            }
        }
        assert!(checked > 5, "{checked} cells held throughout");
    }

    #[test]
    fn turns_step_up_twice_in_every_stride_evenly_spread() {
        for halves in 2..=MAX_STRIDE_HALVES {
            let turns: Vec<u64> = (1..=6 * halves)
                .filter(|&s| turn(s, halves) != turn(s - 1, halves))
                .collect();
            assert_eq!(turns.len() as u64, 12, "halves {halves}");
            for w in turns.windows(2) {
                let gap = 2 * (w[1] - w[0]);
                assert!(
                    gap + 1 >= halves && gap <= halves + 1,
                    "{halves}: {turns:?}"
                );
            }
        }
        // At a stride of 1.5, one broadcast in three is off turn.
        assert_eq!(
            (1..=6)
                .map(|s| turn(s, 3) != turn(s - 1, 3))
                .collect::<Vec<_>>(),
            [false, true, true, false, true, true]
        );
    }

    /// The whole flock of [`frame`] in view from a corner, with `budget`.
    fn whole_view(budget: u32) -> View {
        View {
            min: [0.0, 0.0, 0.0],
            max: [100.0, 100.0, 50.0],
            eye: Some([0.0, 0.0, 0.0]),
            budget_bytes_per_s: Some(budget),
        }
    }

    /// A viewer of [`whole_view`] within `budget`, connected at 0.
    fn watching(budget: u32) -> ViewerInterest {
        ViewerInterest::new(whole_view(budget), Duration::ZERO, PROTOCOL_MINOR)
    }

    /// The cells `v` holds in full.
    fn cells_in_full(v: &ViewerInterest) -> usize {
        v.cells.iter().filter(|c| c.held[0].is_some()).count()
    }

    /// Serves `viewers` the broadcasts `seqs` (seq, connection time) of a
    /// flock ticking twice a broadcast; `before(v, seq, viewer)` runs
    /// before each send. Returns each viewer's mirror, the seqs at which
    /// each of its cells was updated, and the cell updates encoded.
    #[expect(clippy::type_complexity, reason = "a test's tuple of results")]
    fn serve(
        viewers: &mut [ViewerInterest],
        seqs: impl IntoIterator<Item = (u64, Duration)>,
        before: impl FnMut(usize, u64, &mut ViewerInterest),
    ) -> (
        Vec<CellMirror>,
        Vec<std::collections::HashMap<u32, Vec<u64>>>,
        u64,
    ) {
        serve_paused(viewers, seqs, |_| false, before)
    }

    /// [`serve`], the server paused at the seqs `paused` says.
    #[expect(clippy::type_complexity, reason = "a test's tuple of results")]
    fn serve_paused(
        viewers: &mut [ViewerInterest],
        seqs: impl IntoIterator<Item = (u64, Duration)>,
        paused: impl Fn(u64) -> bool,
        mut before: impl FnMut(usize, u64, &mut ViewerInterest),
    ) -> (
        Vec<CellMirror>,
        Vec<std::collections::HashMap<u32, Vec<u64>>>,
        u64,
    ) {
        let tel = Arc::new(Telemetry::default());
        let mut b = CellBuilder::default();
        let mut mirrors: Vec<Option<CellMirror>> = viewers.iter().map(|_| None).collect();
        let mut updates = vec![std::collections::HashMap::<u32, Vec<u64>>::new(); viewers.len()];
        for (seq, now) in seqs {
            let set = b
                .build(seq, &frame(2 * seq), [100.0, 100.0, 50.0], 3, &tel)
                .unwrap();
            for (v, vi) in viewers.iter_mut().enumerate() {
                before(v, seq, vi);
                let out = vi.send(&set, now, paused(seq));
                let m =
                    mirrors[v].get_or_insert_with(|| CellMirror::new(set.now.grid, set.now.quant));
                if let Some(batch) = out.batch {
                    vi.budget.sent(batch.len(), Duration::ZERO, now);
                    m.apply(&batch).unwrap();
                }
                for c in m.held_cells() {
                    if m.cell(c).is_some_and(|f| f.tick == set.now.tick) {
                        updates[v].entry(c).or_default().push(seq);
                    }
                }
            }
        }
        let mirrors = mirrors.into_iter().map(Option::unwrap).collect();
        (mirrors, updates, tel.cell_updates_encoded.get())
    }

    /// Cells `m` holds that are not at `tick`.
    fn stale_cells(m: &CellMirror, tick: u64) -> usize {
        m.held_cells()
            .filter(|&c| m.cell(c).is_some_and(|f| f.tick != tick))
            .count()
    }

    fn held_boids(m: &CellMirror) -> usize {
        m.held_cells()
            .filter_map(|c| m.cell(c))
            .map(Frame::len)
            .sum()
    }

    /// Each cell held from before `from` to the end was updated `want`
    /// times after `from`, never missing two turns in a row (`max_gap`
    /// seqs apart at most).
    fn assert_cadence(
        updates: &std::collections::HashMap<u32, Vec<u64>>,
        from: u64,
        want: usize,
        max_gap: u64,
    ) {
        let mut checked = 0;
        let end = updates
            .values()
            .filter_map(|s| s.last())
            .max()
            .copied()
            .unwrap_or(0);
        for (c, seqs) in updates {
            // Boids drift across cells: those that joined later or emptied.
            if seqs.first().is_none_or(|&s| s > from)
                || seqs.last().is_none_or(|&s| s + max_gap < end)
            {
                continue;
            }
            checked += 1;
            let last: Vec<u64> = seqs.iter().copied().filter(|&s| s > from).collect();
            assert_eq!(last.len(), want, "cell {c}: {last:?}");
            assert!(
                last.windows(2).all(|w| w[1] - w[0] <= max_gap),
                "cell {c}: {last:?}"
            );
        }
        assert!(checked > 50, "{checked} cells held throughout");
    }

    fn at_hz(hz: f64) -> impl Fn(u64) -> (u64, Duration) {
        move |seq| (seq, Duration::from_secs_f64(seq as f64 / hz))
    }

    #[test]
    fn a_viewer_with_a_crop_slot_holds_the_boids_in_its_view_and_little_else() {
        // A view whose x faces cut cells (10 m cells: 23 and 61 m), a
        // budget that holds all of it; one viewer crops, one may not.
        let view = View {
            min: [23.0, 0.0, 0.0],
            max: [61.0, 100.0, 50.0],
            eye: Some([42.0, 50.0, 120.0]),
            budget_bytes_per_s: Some(2_000_000),
        };
        let slots = std::sync::Arc::new(CropSlots::default());
        let mut vi = [0u8, 1].map(|_| ViewerInterest::new(view, Duration::ZERO, PROTOCOL_MINOR));
        vi[0].set_crop_slots(slots.clone());
        let (m, _, _) = serve(&mut vi, (1..=60).map(at_hz(30.0)), |_, _, _| {});
        assert!(vi[0].crops() && !vi[1].crops());
        // What the last broadcast holds (seq 60: tick 120).
        let last = frame(120);
        let quant = last.quant.unwrap();
        let x = |q: [u16; 3]| quant.dequantize(q)[0];
        let held = |m: &CellMirror| -> std::collections::HashMap<u32, f32> {
            m.held_cells()
                .filter_map(|c| m.cell(c))
                .flat_map(|f| (0..f.len()).map(move |i| (f.ids[i], x(f.position(i)))))
                .collect()
        };
        let (cropped, whole) = (held(&m[0]), held(&m[1]));
        for i in 0..last.len() {
            let p = x(last.position(i));
            if (view.min[0]..=view.max[0]).contains(&p) {
                for h in [&cropped, &whole] {
                    let at = h.get(&last.ids[i]).copied();
                    assert!(
                        at.is_some_and(|a| (a - p).abs() < 0.2),
                        "boid {} at {p}: {at:?}",
                        last.ids[i]
                    );
                }
            }
        }
        // Cropped: nothing further out than a step of the lattice (1.25 m)
        // and a quantisation step; whole: the grazed cells' every boid.
        let step = 10.0 / f32::from(crate::engine::crop::CROP_STEPS) + 0.01;
        assert!(
            cropped
                .values()
                .all(|&a| a >= view.min[0] - step && a <= view.max[0] + step),
            "{:?}",
            cropped
                .values()
                .filter(|&&a| a < view.min[0] - step || a > view.max[0] + step)
                .collect::<Vec<_>>()
        );
        assert!(whole.values().any(|&a| a < view.min[0] - 2.0));
        assert!(
            cropped.len() < whole.len(),
            "{} vs {}",
            cropped.len(),
            whole.len()
        );
        drop(vi);
        assert_eq!(slots.taken(), 0, "the slot goes with the viewer");
    }

    #[test]
    fn cropping_viewers_whose_views_move_hold_exactly_what_they_were_sent() {
        // Nine viewers from networks of their own (eight crop, the last
        // may not) whose views cut cells at faces of their own and move
        // every few broadcasts: a cell's cropped forms run out (twelve)
        // and crops change under held frames. Every frame a viewer holds
        // must be the cell's boids in the crop the server thinks it holds,
        // at that broadcast, to within the precision it was sent at.
        let slots = std::sync::Arc::new(CropSlots::default());
        let view = |v: usize, seq: u64| {
            let shift = (seq / 5 % 3) as f32 * 1.7 + v as f32 * 0.9;
            View {
                min: [11.0 + shift, 3.0 + shift, 0.0],
                max: [58.0 + 2.0 * shift, 77.0 - shift, 31.0 + shift],
                eye: Some([30.0, 30.0, 90.0]),
                budget_bytes_per_s: Some(2_000_000),
            }
        };
        let mut vi: Vec<ViewerInterest> = (0..9)
            .map(|v| {
                let mut vi = ViewerInterest::new(view(v, 0), Duration::ZERO, PROTOCOL_MINOR);
                vi.set_address(std::net::IpAddr::from(
                    (0x0a00_0000 + ((v as u32) << 8)).to_be_bytes(),
                ));
                vi.set_crop_slots(slots.clone());
                vi
            })
            .collect();
        let (mirrors, _, _) = serve(&mut vi, (1..=45).map(at_hz(30.0)), |v, seq, vi| {
            if seq % 5 == 0 {
                vi.set_view(view(v, seq));
            }
        });
        assert_eq!(vi.iter().filter(|v| v.crops()).count(), 8);
        let mut checked = [0usize; 2];
        for (vi, m) in vi.iter().zip(&mirrors) {
            let grid = m.grid();
            for c in m.held_cells() {
                let held = m.cell(c).unwrap();
                let (seq, precision, crop) = vi.cells[c as usize].held[0].unwrap();
                let whole = frame(2 * seq);
                let mut cell = Frame {
                    tick: whole.tick,
                    quant: whole.quant,
                    ..Frame::default()
                };
                for i in 0..whole.len() {
                    if grid.cell_of(whole.position(i)) == c {
                        cell.push_boid(&whole, i);
                    }
                }
                let mut want = Frame::default();
                crop.apply(&grid, c, &cell, &mut want);
                assert_eq!(held.tick, 2 * seq, "cell {c}");
                assert_eq!(held.ids, want.ids, "cell {c} cropped {crop:?}");
                let tolerance = 1i32 << precision.pos_shift;
                for i in 0..want.len() {
                    let (a, b) = (held.position(i), want.position(i));
                    assert!(
                        (0..3).all(|k| (i32::from(a[k]) - i32::from(b[k])).abs() <= tolerance),
                        "cell {c} boid {}: {a:?} for {b:?}",
                        want.ids[i]
                    );
                }
                checked[usize::from(crop.is_whole())] += 1;
            }
        }
        assert!(
            checked[0] > 20 && checked[1] > 20,
            "cropped, whole: {checked:?}"
        );
    }

    #[test]
    fn crop_slots_go_round_the_viewers_that_want_them() {
        let slots = std::sync::Arc::new(CropSlots::default());
        let n = crate::engine::crop::CROPPING_VIEWERS + 1;
        let mut vi: Vec<ViewerInterest> = (0..n)
            .map(|v| {
                let mut vi = watching(100_000);
                vi.set_address(std::net::IpAddr::from(
                    (0x0a00_0000 + ((v as u32) << 8)).to_be_bytes(),
                ));
                vi.set_crop_slots(slots.clone());
                vi.grazes = true; // as its first send would find
                vi
            })
            .collect();
        let at = |s: f64| Duration::from_secs_f64(s);
        // Every second for a while: the first eight take the slots.
        for t in 0..5 {
            for v in &mut vi {
                v.crop_turn(at(f64::from(t)));
            }
        }
        let last = n - 1;
        assert!(vi[..last].iter().all(ViewerInterest::crops));
        assert!(!vi[last].crops(), "refused: all taken");
        assert_eq!(slots.waiting(), 1);
        // Past the lease, with the last one waiting, one holder hands its
        // slot back (one viewer waits), the others renew theirs, and the
        // last one (asking every second) takes it.
        let turns = |vi: &mut [ViewerInterest], ts: std::ops::RangeInclusive<u64>| {
            for t in ts {
                for v in vi.iter_mut() {
                    v.crop_turn(at(t as f64));
                }
            }
        };
        let lease = CROP_LEASE.as_secs();
        turns(&mut vi, 5..=lease + 1);
        assert_eq!(
            vi[..last].iter().filter(|v| v.crops()).count(),
            last - 1,
            "one holder handed back, for the one that waited"
        );
        turns(&mut vi, lease + 2..=lease + CROP_REST.as_secs() + 2);
        assert!(vi[last].crops(), "the waiting viewer got a slot");
        assert_eq!(slots.waiting(), 1, "the one that handed back waits in turn");
        assert_eq!(slots.taken(), crate::engine::crop::CROPPING_VIEWERS);
        assert_eq!(
            vi[..last].iter().filter(|v| v.crops()).count(),
            last - 1,
            "one holder handed back, for the one that waited"
        );
        // A view that grazes no cell (the whole quantisation box) takes no
        // slot, and a holder whose view stops grazing gives its slot back.
        let everything = View {
            min: [-100.0, -100.0, -100.0],
            max: [300.0, 300.0, 200.0],
            eye: None,
            budget_bytes_per_s: Some(100_000),
        };
        let mut wide = [ViewerInterest::new(
            everything,
            Duration::ZERO,
            PROTOCOL_MINOR,
        )];
        wide[0].set_crop_slots(slots.clone());
        let before = slots.taken();
        serve(&mut wide, (1..=40).map(at_hz(30.0)), |_, _, _| {});
        assert!(!wide[0].crops() && slots.taken() == before);
        drop(wide);
        // Alone, a holder renews its lease.
        drop(vi);
        let mut alone = watching(100_000);
        alone.set_crop_slots(slots.clone());
        alone.grazes = true;
        for t in 0..100 {
            alone.crop_turn(at(f64::from(t)));
            assert!(t == 0 || alone.crops(), "gave its slot back at {t} s");
        }
    }

    #[test]
    fn at_thirty_broadcasts_a_second_held_cells_are_updated_twenty_times() {
        let mut vi = [watching(2_000_000)];
        let (m, updates, _) = serve(&mut vi, (1..=90).map(at_hz(30.0)), |_, _, _| {});
        assert_eq!(held_boids(&m[0]), 4000, "the budget holds the whole view");
        // The last two seconds (60 broadcasts): 40 updates a cell, all
        // cells at the same broadcasts.
        assert_cadence(&updates[0], 30, 40, 2);
        let first = updates[0].values().find(|s| s[0] <= 30).unwrap();
        for seqs in updates[0].values().filter(|s| s[0] <= 30) {
            assert_eq!(
                seqs.iter().filter(|&&s| s > 30).collect::<Vec<_>>(),
                first.iter().filter(|&&s| s > 30).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_viewer_taking_every_other_of_sixty_broadcasts_gets_twenty_updates_a_second() {
        let mut vi = [watching(2_000_000)];
        let (m, updates, _) = serve(&mut vi, (1..=120).map(|i| at_hz(60.0)(2 * i)), |_, _, _| {});
        assert_eq!(held_boids(&m[0]), 4000);
        // After the rate is measured, sends 61 ..= 120 (seqs 122 ..= 240,
        // two seconds): 40 updates.
        assert_cadence(&updates[0], 121, 40, 4);
    }

    #[test]
    fn late_and_skipped_broadcasts_keep_the_stride_and_the_held_set() {
        let jittered = (1..=90u64).filter(|&s| s % 17 != 0).map(|s| {
            // Every fifth send is 60 ms late; every seventeenth broadcast
            // never reaches this viewer.
            let late = if s % 5 == 0 { 0.060 } else { 0.0 };
            (s, Duration::from_secs_f64(s as f64 / 30.0 + late))
        });
        let mut vi = [watching(400_000)];
        let mut held = Vec::new();
        let (_, _, _) = serve(&mut vi, jittered, |_, seq, v| {
            if seq > 30 {
                assert_eq!(v.halves, 3, "seq {seq}: {} Hz", v.broadcast_hz);
                held.push(cells_in_full(v));
            }
        });
        // Boids drift into more cells; none held is ever dropped.
        assert!(
            held[0] > 0 && held.windows(2).all(|w| w[1] >= w[0]),
            "cells held after 1 s: {held:?}"
        );
    }

    #[test]
    fn a_server_broadcasting_twice_a_second_gets_its_rate_measured_and_the_budget_used() {
        // A server slower than the assumed 30 broadcasts a second from the
        // start (a million boids ticks about 4 times a second), 20 s of it.
        // At 32 kB/s, less the summaries (about 12 kB/s), the full set is
        // sized for 2 updates a second: most of the view.
        let mut vi = [watching(32_000)];
        let (m, _, _) = serve(&mut vi, (1..=40).map(at_hz(2.0)), |_, _, _| {});
        let [v] = &vi;
        assert!(
            (1.8..=2.2).contains(&v.broadcast_hz),
            "{} broadcasts a second",
            v.broadcast_hz
        );
        assert!((1.9..=2.1).contains(&v.full_hz()), "{}", v.full_hz());
        // Sized for 20 updates a second (the rate never measured) it held
        // 318 boids; for 5 (the old floor), 1489; now 3511.
        let held = held_boids(&m[0]);
        assert!(held > 3000, "{held} of 4000 boids held in full");
    }

    #[test]
    fn a_pause_with_steps_keeps_the_stride_and_the_full_set() {
        // 3 s at 30 broadcasts a second, then paused for 10 s with a step
        // every 4 s, then 2 s more.
        let mut seqs: Vec<(u64, Duration)> = (1..=90).map(at_hz(30.0)).collect();
        seqs.push((91, Duration::from_secs(7)));
        seqs.push((92, Duration::from_secs(11)));
        let resume = Duration::from_secs(13);
        seqs.extend(
            (93..=152).map(|s| (s, resume + Duration::from_secs_f64((s - 92) as f64 / 30.0))),
        );
        let mut vi = [watching(100_000)];
        let (mut before, mut most) = (0, 0);
        serve(&mut vi, seqs, |_, seq, v| {
            assert_eq!(v.halves, 3, "seq {seq}: {} Hz", v.broadcast_hz);
            let held = cells_in_full(v);
            if seq == 90 {
                before = held;
            } else if seq > 90 {
                most = most.max(held);
            }
        });
        // The budget binds (the view holds 360 cells), and the pause does
        // not size the set for a send a second apart.
        assert!(before > 0 && before < 300, "{before} cells held");
        assert!(
            most <= before + before / 5,
            "{before} cells held, then {most}"
        );
    }

    #[test]
    fn a_viewer_joining_a_paused_server_takes_its_rate_after_the_pause() {
        // Paused: a step every 4 s; then 3 s at 30 broadcasts a second.
        // The steps are not the rate (measured across them it read 0.25
        // Hz, and the set was sized for one update a second after resume).
        let mut seqs: Vec<(u64, Duration)> = (1..=3)
            .map(|s| (s, Duration::from_secs(4 * s - 3)))
            .collect();
        let resume = Duration::from_secs(10);
        seqs.extend((4..=93).map(|s| (s, resume + Duration::from_secs_f64((s - 3) as f64 / 30.0))));
        let mut vi = [watching(100_000)];
        let mut held = Vec::new();
        serve_paused(
            &mut vi,
            seqs,
            |s| s <= 3,
            |_, seq, v| {
                assert_eq!(v.halves, 3, "seq {seq}: {} Hz", v.broadcast_hz);
                if seq > 40 {
                    held.push(cells_in_full(v));
                }
            },
        );
        let [v] = &vi;
        assert!(
            (28.0..=32.0).contains(&v.broadcast_hz),
            "{}",
            v.broadcast_hz
        );
        // The set settles once: within a tenth after resume (boids drift).
        let (lo, hi) = (held.iter().min().unwrap(), held.iter().max().unwrap());
        assert!(
            *lo > 0 && 10 * hi <= 11 * lo,
            "cells held after resume: {held:?}"
        );
    }

    #[test]
    fn a_cell_that_missed_its_turn_goes_at_the_next_send() {
        let mut vi = [watching(2_000_000)];
        // Turns step up at the seqs not 1 modulo 3. At 51, a turn, the
        // bucket is empty (it holds at most a fifth of a second of the rate).
        let (_, updates, _) = serve(&mut vi, (1..=60).map(at_hz(30.0)), |_, seq, v| {
            if seq == 51 {
                v.budget.refill(Duration::from_secs_f64(51.0 / 30.0));
                v.budget.spend(v.budget.rate() as usize / 5 + 1);
            }
        });
        // The cells missed at 51 go at 52, off turn, then keep their turns.
        let mut checked = 0;
        for seqs in updates[0].values().filter(|s| s[0] <= 30) {
            let around: Vec<u64> = seqs
                .iter()
                .copied()
                .filter(|&s| (48..=56).contains(&s))
                .collect();
            assert_eq!(around, [48, 50, 52, 53, 54, 56], "{seqs:?}");
            checked += 1;
        }
        assert!(checked > 50);
    }

    #[test]
    fn viewers_alike_share_every_encoding() {
        let one = serve(
            &mut [watching(2_000_000)],
            (1..=60).map(at_hz(30.0)),
            |_, _, _| {},
        )
        .2;
        let mut three: Vec<_> = (0..3).map(|_| watching(2_000_000)).collect();
        let (m, _, encoded) = serve(&mut three, (1..=60).map(at_hz(30.0)), |_, _, _| {});
        assert!(m.iter().all(|m| held_boids(m) == 4000));
        assert_eq!(encoded, one, "three viewers alike cost what one does");
    }

    #[test]
    fn far_cells_are_sent_coarser_and_near_ones_exact() {
        // A 434 m world (100k boids at the default density): 8.3 mm steps.
        let quant = QuantBox::around_world([434.0, 434.0, 217.0], 3);
        assert_eq!(precision_at(0.0, &quant), Precision::EXACT);
        assert_eq!(precision_at(5.0, &quant), Precision::EXACT);
        let mut last = Precision::EXACT;
        for d in [10.0, 30.0, 100.0, 300.0, 1000.0, 1e5] {
            let p = precision_at(d, &quant);
            assert!(p.pos_shift >= last.pos_shift && p.heading_shift >= last.heading_shift);
            // Drawn within half a pixel: half a coarse step is at most that.
            let half_step = f32::from(1u16 << p.pos_shift) * 0.5 * quant.step_m()[0];
            assert!(
                half_step <= 0.5 * d * PIXEL_RAD || p == COARSEST,
                "{d} m: {p:?}"
            );
            last = p;
        }
        assert_eq!(last, COARSEST);
        // From 110 m up, as the interest benchmark's probe sees its view.
        assert!(precision_at(110.0, &quant).pos_shift >= 3);
    }

    #[test]
    fn a_cell_the_view_only_grazes_weighs_less_than_one_inside_it() {
        let (world, quant) = (
            [100.0, 100.0, 50.0],
            QuantBox::around_world([100.0, 100.0, 50.0], 3),
        );
        let grid = CellGrid::for_world(world, 3);
        // The view: all of the first column of cells along x, and a fifth
        // of the second; the eye high above, as far from both.
        let (lo, hi) = grid.bounds_m(0, &quant);
        let edge = hi[0] - lo[0];
        let view = View {
            min: [lo[0], -100.0, -100.0],
            max: [hi[0] + 0.2 * edge, 200.0, 200.0],
            eye: Some([hi[0], 50.0, 1e4]),
            budget_bytes_per_s: Some(64_000),
        };
        let mut vi = ViewerInterest::new(view, Duration::ZERO, PROTOCOL_MINOR);
        vi.locate(grid, quant);
        let weight = |c: u32| vi.in_view.iter().find(|w| w.0 == c).map(|w| w.1);
        let mut compared = 0;
        for c in 0..grid.len() as u32 {
            let k = grid.coords(c);
            if k[0] == 0 {
                let next = c + 1; // the same row, one cell along x
                let (inside, grazed) = (weight(c).unwrap(), weight(next).unwrap());
                assert!(
                    grazed < 0.5 * inside,
                    "cell {c}: {inside} vs {next}: {grazed}"
                );
                compared += 1;
            } else if k[0] > 1 {
                assert!(weight(c).is_none(), "cell {c} is out of view");
            }
        }
        assert!(compared > 0);
    }
}
