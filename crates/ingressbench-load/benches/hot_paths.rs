//! The load engine's per-request hot paths: parsing a response as it streams in, and the
//! open-loop schedule that says when each request is due.

// criterion_group! declares an undocumented public function.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use ingressbench_load::fuzzing::{parse_response, schedule_sum, Parsed};

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sun, 22 Nov 2026 04:00:00 GMT\r\nContent-Type: text/plain\r\nContent-Length: 32\r\nConnection: keep-alive\r\nx-backend: echo-1\r\nx-echo-path: /\r\n\r\n0123456789abcdef0123456789abcdef";

fn parser(c: &mut Criterion) {
    let mut group = c.benchmark_group("response parser");
    group.throughput(Throughput::Bytes(RESPONSE.len() as u64));
    group.bench_function("whole response", |b| {
        b.iter(|| {
            let parsed = parse_response(black_box(RESPONSE), &[], false);
            assert!(matches!(parsed, Parsed::Done { status: 200, .. }));
        })
    });
    group.bench_function("in 4 pieces", |b| {
        b.iter(|| parse_response(black_box(RESPONSE), &[13, 60, 150], false))
    });
    group.finish();
}

fn schedule(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule");
    group.throughput(Throughput::Elements(100_000));
    group.bench_function("100k intended times, 1 of 2 workers", |b| {
        b.iter(|| schedule_sum(black_box(20_000.0), 0, 2, 200_000))
    });
    group.finish();
}

criterion_group!(benches, parser, schedule);
criterion_main!(benches);
