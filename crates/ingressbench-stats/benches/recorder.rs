//! The recorder's per-request cost: every finished request goes through `record` on the
//! worker thread, so it bounds the generator's throughput.

// criterion_group! declares an undocumented public function.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use ingressbench_stats::{Outcome, Recorder, Sample};

fn samples(n: u64) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let mut s = Sample::new(i * 1_000);
            s.sent_at_ns = s.intended_at_ns + 20_000;
            s.done_at_ns = s.sent_at_ns + 100_000 + (i * 7_919) % 900_000;
            s.outcome = if i % 97 == 0 {
                Outcome::Status(503)
            } else {
                Outcome::Status(200)
            };
            s.bytes = 798;
            s
        })
        .collect()
}

fn record(c: &mut Criterion) {
    let batch = samples(10_000);
    let mut group = c.benchmark_group("recorder");
    group.throughput(Throughput::Elements(batch.len() as u64));
    group.bench_function("record 10k samples", |b| {
        b.iter(|| {
            let mut r = Recorder::new(1_000_000_000);
            for s in &batch {
                r.record(black_box(s));
            }
            r
        })
    });
    group.finish();
}

criterion_group!(benches, record);
criterion_main!(benches);
