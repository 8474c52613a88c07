//! Criterion benches of one tick (grid rebuild included) for scenarios A and
//! B of SPEC §5. `starling bench` reports the same scenarios as JSON lines.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use starling_sim::{Flock, scenarios};

fn step(c: &mut Criterion) {
    let mut group = c.benchmark_group("step");
    group.sample_size(10);
    for n in [10_000usize, 100_000] {
        group.throughput(Throughput::Elements(n as u64));
        let mut a = Flock::new(scenarios::kernel_a(n)).expect("scenario A is valid");
        group.bench_with_input(BenchmarkId::new("A-kernel", n), &n, |b, _| {
            b.iter(|| a.step())
        });
        let mut full = Flock::new(scenarios::full_b(n)).expect("scenario B is valid");
        for _ in 0..120 {
            full.step();
        }
        group.bench_with_input(BenchmarkId::new("B-full", n), &n, |b, _| {
            b.iter(|| full.step())
        });
    }
    group.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
