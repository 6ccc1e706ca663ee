//! Fuzzes the scenario parser and expander: any text gives cells or an error, never a
//! panic (and a hostile matrix cannot blow up: the product is bounded by what it lists).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if text.len() < 4096 {
            let _ = ingressbench_scenario::expand(text, std::path::Path::new("fuzz.yaml"), &[], false);
        }
    }
});
