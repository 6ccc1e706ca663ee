//! Ctrl-C and SIGTERM: the first asks the run to stop and keep what it measured, a second
//! one exits at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Exit status of a process ended by SIGINT, by shell convention.
const EXIT_INTERRUPTED: i32 = 130;

/// Sets the returned flag on the first SIGINT or SIGTERM; exits on the second.
pub(crate) fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new().name("ib-signals".into()).spawn(move || {
        runtime.block_on(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
                return;
            };
            for _ in 0..2 {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                if flag.swap(true, Ordering::SeqCst) {
                    eprintln!("\ninterrupted again: exiting now");
                    std::process::exit(EXIT_INTERRUPTED);
                }
                eprintln!("\ninterrupted: stopping cleanly and keeping what was measured (Ctrl-C again to quit now)");
            }
        });
    })?;
    Ok(stop)
}
