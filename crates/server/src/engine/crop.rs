//! A cell cropped to a viewer's view: the boids of the cell within a
//! sub-box on a lattice of [`CROP_STEPS`] steps a cell along each axis,
//! the smallest that covers the part of the view inside the cell.
//!
//! Why: the cells a view touches hold about twice the boids inside it
//! (at 100k boids, 21,900 against 10,200 for a tenth of the world), so a
//! budget that pays for the boids in view paid for half of them again in
//! cells the view only grazes. A crop on a lattice of sixteenths of a cell
//! wastes at most a sixteenth of a cell on each face of the view: at 100k
//! boids the probe of `bench --scenario interest` holds 10,500 boids for
//! the 10,200 inside its view (10,900 on a lattice of eighths, where 0.3 %
//! of the boids in view were stale for want of budget, against 0.04 %).
//!
//! Why a lattice, not the view's own faces: an update cropped alike is
//! shared, like any cell update (`interest.rs` keeps a cell's cropped
//! forms in a bounded list of their own, and a viewer finding no room is
//! sent the cell whole). A viewer sees no difference between a cropped
//! cell and a whole one: a cell's frame holds the boids it was sent, and a
//! boid that leaves the crop is gone from it as one that leaves the cell.
//!
//! Who crops: random cameras crop alike only by chance, so a crop is
//! mostly an encode of one viewer's own (about 5 µs; a thousand viewers
//! cropping made 14,000 a broadcast, 75 ms). So only [`CROPPING_VIEWERS`]
//! viewers crop at once ([`CropSlots`]: viewers whose view grazes a cell
//! take them first come and hold them for a lease; the others are sent
//! whole cells, shared as before crops), and a broadcast encodes at most
//! `CROPPED_ENCODES` crops whoever asks (`interest.rs`). A viewer that
//! cropped and is refused one gets the whole cell against the cropped
//! frames it holds, an encode of its own too: so who crops is decided per
//! viewer, for a lease at a time, not per cell.
//!
//! Which boids are in a crop is an integer function of their quantised
//! position, as their cell is (`CellGrid::cell_of`): a coordinate `q`
//! along an axis cut into `n` cells lies in step `(q · n · STEPS) >> 16`
//! of the whole axis, which is step `(q · n) >> 16` times `STEPS` plus its
//! step within the cell.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use starling_protocol::interest::CellGrid;
use starling_protocol::{Frame, QuantBox};

use super::interest::Asker;

/// Viewers whose cells are cropped at once, at most ([`CropSlots`]).
pub const CROPPING_VIEWERS: usize = 8;
/// Of those, the most from one network ([`Asker::viewer`]).
pub const CROPPING_VIEWERS_PER_ADDRESS: usize = 2;

/// Who crops now: [`CROPPING_VIEWERS`] slots, taken first come. A viewer
/// refused one for want of a free slot waits ([`CropWait`], while it goes
/// on asking); a holder at the end of its lease (`http/ws/interest.rs`)
/// hands its slot back when more viewers wait than slots were handed back
/// for them ([`CropSlots::hand_back`]), else renews it. So slots go round
/// the viewers that want them, one handed back for each that waits (a
/// network refused past its own share does not wait).
#[derive(Debug, Default)]
pub struct CropSlots {
    state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    /// Slots held, by network.
    held: HashMap<Asker, usize>,
    /// Viewers waiting for a slot.
    waiting: usize,
    /// Slots handed back for them and not taken since.
    freed: usize,
}

/// A slot taken; given back when dropped (the viewer went).
#[derive(Debug)]
pub struct CropSlot {
    slots: Arc<CropSlots>,
    asker: Asker,
}

/// A viewer waiting for a slot; it stops waiting when dropped (it took
/// one, its view stopped grazing, or it went).
#[derive(Debug)]
pub struct CropWait {
    slots: Arc<CropSlots>,
}

/// What asking for a slot got.
#[derive(Debug)]
pub enum Asked {
    /// A slot.
    Slot(CropSlot),
    /// None free: the viewer should wait ([`CropSlots::wait`]).
    Full,
    /// Its network holds its share ([`CROPPING_VIEWERS_PER_ADDRESS`]).
    NetworkFull,
}

impl CropSlots {
    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks for a slot for a viewer from `asker`.
    pub fn ask(self: &Arc<Self>, asker: Asker) -> Asked {
        let mut st = self.state();
        let total: usize = st.held.values().sum();
        let mine = st.held.get(&asker).copied().unwrap_or(0);
        if mine >= CROPPING_VIEWERS_PER_ADDRESS {
            return Asked::NetworkFull;
        }
        if total >= CROPPING_VIEWERS {
            return Asked::Full;
        }
        st.held.insert(asker, mine + 1);
        st.freed = st.freed.saturating_sub(1);
        Asked::Slot(CropSlot {
            slots: self.clone(),
            asker,
        })
    }

    /// A viewer refused for want of a free slot waits, until the guard is
    /// dropped.
    pub fn wait(self: &Arc<Self>) -> CropWait {
        self.state().waiting += 1;
        CropWait {
            slots: self.clone(),
        }
    }

    /// Whether a holder at the end of its lease hands its slot back: when
    /// more viewers wait than slots were handed back for them (counted
    /// handed back when so).
    pub fn hand_back(&self) -> bool {
        let mut st = self.state();
        if st.waiting > st.freed {
            st.freed += 1;
            return true;
        }
        false
    }

    /// Slots held now.
    pub fn taken(&self) -> usize {
        self.state().held.values().sum()
    }

    /// Viewers waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.state().waiting
    }
}

impl Drop for CropSlot {
    fn drop(&mut self) {
        let mut st = self.slots.state();
        if let Some(n) = st.held.get_mut(&self.asker) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.held.remove(&self.asker);
            }
        }
    }
}

impl Drop for CropWait {
    fn drop(&mut self) {
        let mut st = self.slots.state();
        st.waiting = st.waiting.saturating_sub(1);
    }
}

/// Steps of the crop lattice along each axis of a cell (see the module
/// docs for why 16).
pub const CROP_STEPS: u8 = 16;

/// A sub-box of a cell: steps `lo[a] .. hi[a]` along each axis, of
/// [`CROP_STEPS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Crop {
    lo: [u8; 3],
    hi: [u8; 3],
}

impl Default for Crop {
    fn default() -> Self {
        Self::WHOLE
    }
}

impl Crop {
    /// The whole cell.
    pub const WHOLE: Self = Self {
        lo: [0; 3],
        hi: [CROP_STEPS; 3],
    };

    /// Whether it is the whole cell.
    pub fn is_whole(self) -> bool {
        self == Self::WHOLE
    }

    /// The share of the cell's volume it spans.
    pub fn share(self) -> f32 {
        (0..3)
            .map(|a| f32::from(self.hi[a] - self.lo[a]) / f32::from(CROP_STEPS))
            .product()
    }

    /// The smallest crop of `cell` that holds every boid whose quantised
    /// position lies within `[min, max]` (metres; widened by a
    /// quantisation step, so a boid on the view's face is never cut). An
    /// axis of one cell (z in a 2-D world) is not cropped. For a cell the
    /// view misses it is a sliver at the face nearest the view: callers
    /// crop only cells the view touches.
    pub fn of_view(
        grid: &CellGrid,
        quant: &QuantBox,
        cell: u32,
        min: [f32; 3],
        max: [f32; 3],
    ) -> Self {
        let (lo_m, hi_m) = grid.bounds_m(cell, quant);
        let step = quant.step_m();
        let mut crop = Self::WHOLE;
        for a in 0..3 {
            let len = hi_m[a] - lo_m[a];
            if grid.cells[a] == 1
                || len <= 0.0
                || min[a]
                    .partial_cmp(&max[a])
                    .is_none_or(std::cmp::Ordering::is_gt)
            {
                continue;
            }
            let steps = f32::from(CROP_STEPS);
            let t_lo = ((min[a] - step[a] - lo_m[a]) / len * steps).floor();
            let t_hi = ((max[a] + step[a] - lo_m[a]) / len * steps).ceil();
            let lo = t_lo.clamp(0.0, steps - 1.0) as u8;
            let hi = t_hi.clamp(f32::from(lo) + 1.0, steps) as u8;
            crop.lo[a] = lo;
            crop.hi[a] = hi;
        }
        crop
    }

    /// Writes into `out` the boids of `whole`, the frame of cell `cell`,
    /// that lie in the crop, in the same (id) order; `out`'s buffers are
    /// reused.
    pub fn apply(self, grid: &CellGrid, cell: u32, whole: &Frame, out: &mut Frame) {
        out.tick = whole.tick;
        out.quant = whole.quant;
        out.ids.clear();
        out.pos.clear();
        out.heading.clear();
        let ijk = grid.coords(cell);
        let n = grid.cells.map(u32::from);
        let steps = u32::from(CROP_STEPS);
        let inside = |q: [u16; 3]| {
            (0..3).all(|a| {
                let along = (u32::from(q[a]) * n[a] * steps) >> 16;
                let within = along.wrapping_sub(ijk[a] * steps);
                (u32::from(self.lo[a])..u32::from(self.hi[a])).contains(&within)
            })
        };
        for i in 0..whole.len() {
            if inside(whole.position(i)) {
                out.push_boid(whole, i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn quant() -> QuantBox {
        QuantBox {
            origin_m: [0.0; 3],
            extent_m: [160.0, 160.0, 80.0],
        }
    }

    proptest! {
        /// Any view and any boids of a cell: every boid inside the view is
        /// kept, none more than a step of the lattice (and the
        /// quantisation margin) outside it, and the kept ones stay in order.
        #[test]
        fn a_crop_keeps_every_boid_in_view_and_little_else(
            cell in 0u32..(8 * 8 * 4),
            boids in prop::collection::vec((any::<u16>(), any::<u16>(), any::<u16>()), 0..300),
            a in (-0.2f32..1.2, -0.2f32..1.2, -0.2f32..1.2),
            b in (-0.2f32..1.2, -0.2f32..1.2, -0.2f32..1.2),
        ) {
            let (grid, quant) = (CellGrid { cells: [8, 8, 4] }, quant());
            let (lo, hi) = grid.bounds_m(cell, &quant);
            // Boids anywhere in the cell (its frame, in id order).
            let ijk = grid.coords(cell);
            let q_lo = |a: usize, i: u32| (i * 65536).div_ceil(u32::from(grid.cells[a]));
            let mut frame = Frame { tick: 3, quant: Some(quant), ..Frame::default() };
            for (i, &(x, y, z)) in boids.iter().enumerate() {
                let q: [u16; 3] = std::array::from_fn(|a| {
                    let (l, h) = (q_lo(a, ijk[a]), q_lo(a, ijk[a] + 1).min(65536));
                    (l + u32::from([x, y, z][a]) % (h - l)) as u16
                });
                prop_assert_eq!(grid.cell_of(q), cell);
                frame.ids.push(i as u32);
                frame.pos.extend_from_slice(&q);
                frame.heading.extend_from_slice(&[1, 2]);
            }
            // A view around the cell: its faces anywhere within it or a
            // little beyond.
            let at = |t: (f32, f32, f32)| [t.0, t.1, t.2];
            let (a, b) = (at(a), at(b));
            let min: [f32; 3] = std::array::from_fn(|k| lo[k] + a[k].min(b[k]) * (hi[k] - lo[k]));
            let max: [f32; 3] = std::array::from_fn(|k| lo[k] + a[k].max(b[k]) * (hi[k] - lo[k]));
            let crop = Crop::of_view(&grid, &quant, cell, min, max);
            let mut out = Frame::default();
            crop.apply(&grid, cell, &frame, &mut out);
            prop_assert!(out.ids.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(out.tick, 3);
            let step = [20.0 / f32::from(CROP_STEPS); 3];
            for i in 0..frame.len() {
                let p = quant.dequantize(frame.position(i));
                let kept = out.ids.contains(&frame.ids[i]);
                let in_view = (0..3).all(|a| min[a] <= p[a] && p[a] <= max[a]);
                let touches = (0..3).all(|a| max[a] >= lo[a] && min[a] <= hi[a]);
                if in_view {
                    prop_assert!(kept, "boid {:?} in view {:?}..{:?} was cut", p, min, max);
                }
                // Further than a lattice step (and the quantisation margin,
                // with a step of rounding between metres and quantised
                // units) from a view that touches the cell: cut.
                let margin = |a: usize| step[a] + 3.0 * quant.step_m()[a] + 1e-3;
                let far = (0..3).any(|a| p[a] < min[a] - margin(a) || p[a] > max[a] + margin(a));
                if touches && far {
                    prop_assert!(!kept, "boid {:?} far from view {:?}..{:?} was kept", p, min, max);
                }
            }
        }
    }

    #[test]
    fn crop_slots_are_capped_in_all_and_per_network_and_come_back() {
        let slots = Arc::new(CropSlots::default());
        let ip = |n: u32| {
            Asker::viewer(std::net::IpAddr::from(
                (0x0a00_0000 + (n << 8)).to_be_bytes(),
            ))
        };
        let slot = |a: Asked| match a {
            Asked::Slot(s) => Some(s),
            _ => None,
        };
        let a: Vec<_> = (0..3).filter_map(|_| slot(slots.ask(ip(0)))).collect();
        assert_eq!(a.len(), CROPPING_VIEWERS_PER_ADDRESS, "one network's share");
        // A network refused past its share does not wait.
        assert_eq!(slots.waiting(), 0);
        let mut others: Vec<_> = (1..CROPPING_VIEWERS as u32 - 1)
            .filter_map(|n| slot(slots.ask(ip(n))))
            .collect();
        assert_eq!(slots.taken(), CROPPING_VIEWERS);
        // Two refused for want of a slot wait.
        assert!(matches!(slots.ask(ip(98)), Asked::Full));
        assert!(matches!(slots.ask(ip(99)), Asked::Full));
        let (w1, w2) = (slots.wait(), slots.wait());
        assert_eq!(slots.waiting(), 2);
        // Holders at the end of their leases: two hand back, the rest renew.
        let backs = (0..CROPPING_VIEWERS).filter(|_| slots.hand_back()).count();
        assert_eq!(backs, 2);
        others.truncate(others.len() - 2);
        let got: Vec<_> = [98, 99].map(|n| slot(slots.ask(ip(n)))).into();
        assert!(got.iter().all(Option::is_some), "the waiting took them");
        drop((w1, w2));
        assert_eq!(slots.waiting(), 0);
        assert!(!slots.hand_back(), "nobody waits: leases renew");
        drop((a, others, got));
        assert_eq!(slots.taken(), 0);
    }

    #[test]
    fn an_axis_of_one_cell_is_not_cropped() {
        // A 2-D world: one cell along z, boids at its middle; a view of
        // z = 0 only still takes the whole of z (a crop along it cut no
        // boid, and read as a small share of the cell).
        let grid = CellGrid { cells: [8, 8, 1] };
        let quant = QuantBox {
            origin_m: [0.0, 0.0, -1.0],
            extent_m: [160.0, 160.0, 2.0],
        };
        let c = grid.cell_of([40_000, 40_000, 32_768]);
        let (lo, hi) = grid.bounds_m(c, &quant);
        let mid = 0.5 * (lo[0] + hi[0]);
        let crop = Crop::of_view(&grid, &quant, c, [mid, -5.0, 0.0], [200.0, 200.0, 0.0]);
        assert_eq!((crop.lo[2], crop.hi[2]), (0, CROP_STEPS));
        assert!(
            (0.5..=0.5 + 1.0 / f32::from(CROP_STEPS)).contains(&crop.share()),
            "{}",
            crop.share()
        );
    }

    #[test]
    fn a_view_over_the_whole_cell_is_the_whole_cell() {
        let (grid, quant) = (CellGrid { cells: [8, 8, 4] }, quant());
        let c = grid.cell_of([40_000, 40_000, 40_000]);
        let crop = Crop::of_view(&grid, &quant, c, [-5.0; 3], [200.0; 3]);
        assert!(crop.is_whole());
        assert_eq!(crop.share(), 1.0);
        // Half the cell along x: about half its volume.
        let (lo, hi) = grid.bounds_m(c, &quant);
        let mid = 0.5 * (lo[0] + hi[0]);
        let half = Crop::of_view(&grid, &quant, c, [mid, -5.0, -5.0], [200.0; 3]);
        assert!(!half.is_whole());
        assert!(
            (0.5..=0.5 + 1.0 / f32::from(CROP_STEPS)).contains(&half.share()),
            "{}",
            half.share()
        );
    }
}
