//! Keyframes: the whole frame, its ids as runs of consecutive ids (ids
//! handed out in sequence make long runs), then the position and heading
//! blocks as they lie in the frame.

use super::{
    Frame, KEYFRAME_HEADER_BYTES, KIND_KEYFRAME, over, put_f32, put_u16s, put_u32, put_u64,
};
use crate::error::EncodeError;
use crate::limits::{MAX_ID_RUNS, MAX_MESSAGE_BYTES};

/// Encodes a keyframe into `out` (cleared first).
pub fn encode_keyframe(f: &Frame, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    f.check()?;
    let quant = f.quant_box()?;
    let n = f.len();
    let runs = id_runs(&f.ids).count();
    over("id runs", runs, MAX_ID_RUNS)?;
    let total = KEYFRAME_HEADER_BYTES + 8 * runs + 8 * n;
    over("keyframe bytes", total, MAX_MESSAGE_BYTES)?;
    out.clear();
    out.reserve(total);
    out.extend_from_slice(&[KIND_KEYFRAME, 0, 0, 0]);
    put_u32(out, n as u32);
    put_u64(out, f.tick);
    quant.origin_m.iter().for_each(|&v| put_f32(out, v));
    quant.extent_m.iter().for_each(|&v| put_f32(out, v));
    put_u32(out, runs as u32);
    put_u32(out, 0);
    for (start, len) in id_runs(&f.ids) {
        put_u32(out, start);
        put_u32(out, len);
    }
    put_u16s(out, &f.pos);
    out.extend_from_slice(&f.heading);
    debug_assert_eq!(out.len(), total);
    Ok(())
}

/// Ascending ids as runs of consecutive ids.
fn id_runs(ids: &[u32]) -> impl Iterator<Item = (u32, u32)> + '_ {
    let mut k = 0;
    std::iter::from_fn(move || {
        let start = *ids.get(k)?;
        let end = run_end(ids, k);
        let len = (end - k) as u32;
        k = end;
        Some((start, len))
    })
}

/// The end of the run of consecutive ids that starts at `k`.
///
/// PERF: whole chunks of the run are stepped over by a flat comparison
/// (which vectorises); only the chunk holding the break is walked.
fn run_end(ids: &[u32], k: usize) -> usize {
    const CHUNK: usize = 64;
    let mut i = k + 1;
    while i + CHUNK <= ids.len() {
        let unbroken = ids[i..i + CHUNK]
            .iter()
            .zip(&ids[i - 1..])
            .fold(true, |ok, (&id, &prev)| ok & (id == prev.wrapping_add(1)));
        if !unbroken {
            break;
        }
        i += CHUNK;
    }
    while i < ids.len() && ids[i] == ids[i - 1].wrapping_add(1) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs found by the chunked scan equal a one-by-one walk, with breaks
    /// on and around chunk edges.
    #[test]
    fn id_runs_match_a_plain_walk() {
        let plain = |ids: &[u32]| {
            let mut runs: Vec<(u32, u32)> = Vec::new();
            for &id in ids {
                match runs.last_mut() {
                    Some((start, len)) if *start + *len == id => *len += 1,
                    _ => runs.push((id, 1)),
                }
            }
            runs
        };
        for breaks in [
            vec![],
            vec![0],
            vec![63],
            vec![64],
            vec![65],
            vec![1, 2, 3],
            vec![127, 128, 300],
            vec![199],
        ] {
            let mut ids = Vec::new();
            let mut id = 10u32;
            for i in 0..200 {
                id += if breaks.contains(&i) { 5 } else { 1 };
                ids.push(id);
            }
            assert_eq!(id_runs(&ids).collect::<Vec<_>>(), plain(&ids), "{breaks:?}");
        }
        assert_eq!(id_runs(&[]).count(), 0);
    }
}
