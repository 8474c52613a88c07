//! Encode and decode costs for 100k boids on one core: quantising a flock
//! into a frame (ids in random state order, as the sim holds them),
//! keyframe and delta encoding, and applying a delta.

use criterion::{Criterion, criterion_group, criterion_main};
use starling_protocol::{
    DeltaView, Frame, FrameBuilder, KeyframeView, QuantBox, encode_delta, encode_keyframe,
};

const N: usize = 100_000;

/// A deterministic flock: ids shuffled against state order, smooth motion.
fn state(t: f32) -> Vec<(u32, [f32; 3], [f32; 3])> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut ids: Vec<u32> = (0..N as u32).collect();
    for i in (1..N).rev() {
        ids.swap(i, (rnd() * (i + 1) as f32) as usize % (i + 1));
    }
    ids.into_iter()
        .map(|id| {
            let p = [rnd() * 160.0, rnd() * 160.0, rnd() * 80.0];
            let v = [rnd() * 20.0 - 10.0, rnd() * 20.0 - 10.0, rnd() * 4.0 - 2.0];
            let at = |a: usize| p[a] + v[a] * t + 0.5 * (p[a] * 0.01) * t * t;
            (id, [at(0), at(1), at(2)], v)
        })
        .collect()
}

/// Three frames 1/30 s apart. In the last, one boid in 22 turns sharply
/// (its heading step does not fit a delta), as about 4.5 % of the boids of
/// the default live flock do at 30 Hz (`starling bench --scenario wire`).
fn frames() -> (QuantBox, [Frame; 3]) {
    let quant = QuantBox::around_world([160.0, 160.0, 80.0], 3);
    let mut b = FrameBuilder::default();
    let mut f: [Frame; 3] = std::array::from_fn(|k| {
        let s = state(k as f32 / 30.0);
        let mut f = Frame::default();
        b.build(&mut f, 100 + 2 * k as u64, quant, N, |i| s[i])
            .unwrap();
        f
    });
    let mut h = 0x2545_f491_4f6c_dd1du64;
    for i in 0..N {
        h = h.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        if (h >> 33).is_multiple_of(22) {
            f[2].heading[2 * i] ^= 0x40;
        }
    }
    (quant, f)
}

fn bench(c: &mut Criterion) {
    let (quant, [a, b, next]) = frames();
    let flock = state(0.0);
    let mut builder = FrameBuilder::default();
    let mut frame = Frame::default();
    let mut bytes = Vec::new();
    let mut g = c.benchmark_group("protocol_100k");
    g.sample_size(30);
    g.bench_function("quantise_and_order", |bench| {
        bench.iter(|| {
            builder
                .build(&mut frame, 1, quant, N, |i| flock[i])
                .unwrap()
        })
    });
    g.bench_function("encode_keyframe", |bench| {
        bench.iter(|| encode_keyframe(&next, &mut bytes).unwrap())
    });
    g.bench_function("encode_delta", |bench| {
        bench.iter(|| encode_delta(Some(&a), &b, &next, &mut bytes).unwrap())
    });
    encode_delta(Some(&a), &b, &next, &mut bytes).unwrap();
    let delta = bytes.clone();
    g.bench_function("apply_delta", |bench| {
        bench.iter(|| {
            DeltaView::parse(&delta)
                .unwrap()
                .apply(Some(&a), &b, &mut frame)
                .unwrap()
        })
    });
    encode_keyframe(&next, &mut bytes).unwrap();
    g.bench_function("decode_keyframe", |bench| {
        bench.iter(|| KeyframeView::parse(&bytes).unwrap().to_frame(&mut frame))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
