//! Ctrl-C, SIGTERM and SIGHUP (the terminal went away): the first asks the run to stop
//! and keep what it measured, a second one exits at once. Nothing here fails for want of
//! a terminal to write to.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Exit status of a process ended by SIGINT, by shell convention.
const EXIT_INTERRUPTED: i32 = 130;

/// Sets the returned flag on the first SIGINT, SIGTERM or SIGHUP; exits on the second.
pub(crate) fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new().name("ib-signals".into()).spawn(move || {
        runtime.block_on(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
            ) else {
                return;
            };
            for _ in 0..2 {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                    _ = hup.recv() => {}
                }
                if flag.swap(true, Ordering::SeqCst) {
                    say("\ninterrupted again: exiting now");
                    std::process::exit(EXIT_INTERRUPTED);
                }
                say("\ninterrupted: stopping cleanly and keeping what was measured (Ctrl-C again to quit now)");
            }
        });
    })?;
    Ok(stop)
}

/// A line on standard error, or nothing if there is none to write to (a terminal that
/// hung up): `eprintln!` would panic there and lose the run.
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
