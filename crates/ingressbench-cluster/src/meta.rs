//! What every object a run makes carries, and what a pod's state means: the tool's
//! labels and annotations (by which a run finds its own, and a later run what a dead one
//! left), and the waiting reasons that mean a pod will not start. A leaf: the run's
//! namespace, its load workers and the clean-up all read it.

use std::time::Duration;

/// The label every object of the tool carries (`app.kubernetes.io/managed-by`).
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// [`MANAGED_BY`]'s value on every object the tool makes.
pub const TOOL: &str = "ingressbench";

/// The label with the run's id.
pub const RUN_LABEL: &str = "ingressbench.dev/run";

/// The annotation with the run's heartbeat (Unix seconds), refreshed while it runs.
pub const HEARTBEAT: &str = "ingressbench.dev/heartbeat";

/// The annotation naming the process that made the namespace (`BOOT_ID/PID`): a run
/// killed on this machine is known to be gone at once, without waiting for its heartbeat.
pub const OWNER: &str = "ingressbench.dev/owner";

/// A namespace of the tool whose heartbeat is older than this was left by a run that is
/// gone.
pub const STALE_AFTER: Duration = Duration::from_secs(120);

/// Container waiting reasons that mean a pod will not start without a change.
pub const CANNOT_START: &[&str] = &[
    "ErrImageNotKnown",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CrashLoopBackOff",
    "SysctlForbidden",
];

/// The label with a pod's pool.
pub const POOL_LABEL: &str = "app.kubernetes.io/name";
