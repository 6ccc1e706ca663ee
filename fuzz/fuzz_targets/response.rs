//! Fuzzes the streaming response parser: it must never panic, and however the bytes are
//! cut into reads, it must reach the same verdict as when it sees them in one piece.
#![no_main]

use ingressbench_load::fuzzing::parse_response;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // The first bytes choose the cuts and the method; the rest is the response.
    if input.len() < 4 {
        return;
    }
    let head = input[0] & 1 == 1;
    let cuts: Vec<usize> = input[1..4].iter().map(|&b| usize::from(b) * 7).collect();
    let data = &input[4..];
    let whole = parse_response(data, &[], head);
    let split = parse_response(data, &cuts, head);
    assert_eq!(whole, split, "verdict depends on how the bytes were split");
});
