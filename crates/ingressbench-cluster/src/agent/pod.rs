//! A pod's spec as the kubelet reads it: what runs for each container (its command line
//! from an image or a local binary, as which user), its environment (values, fields,
//! Secrets), its sysctls and its readiness probe.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::json;

use super::Runs;

/// What runs for a container, as the kubelet would run it: the program, its arguments
/// and the record of it for [`RAN`]. From an image, the container's command line runs
/// inside the image's root filesystem through [`crate::image::ENTER_COMMAND`], with the
/// image's environment put under `env` and the pod's volumes at their `mounts`. A local
/// binary sees the node's files: its mounts are not made (recorded in [`RAN`] as such).
pub(super) fn command_line(
    runs: &Runs,
    pod: &Pod,
    container: &Container,
    env: &mut Vec<(String, String)>,
    mounts: &[super::volumes::Mount],
) -> (PathBuf, Vec<String>, serde_json::Value) {
    // `$(VAR)` in command and args is the container's variable, as the kubelet
    // expands it.
    let expand = |list: &Option<Vec<String>>| -> Option<Vec<String>> {
        list.as_ref().map(|l| {
            l.iter()
                .map(|a| {
                    env.iter()
                        .fold(a.clone(), |a, (k, v)| a.replace(&format!("$({k})"), v))
                })
                .collect()
        })
    };
    let (command, args) = (expand(&container.command), expand(&container.args));
    match runs {
        Runs::Binary { binary, .. } => {
            let argv = args.unwrap_or_default();
            let record = json!({
                "ran": "binary", "binary": binary, "argv": argv,
                "mounts_not_made": mounts.iter().map(|m| &m.target).collect::<Vec<_>>(),
            });
            (binary.clone(), argv, record)
        }
        Runs::Image(image) => {
            let argv = image.argv(command.as_deref(), args.as_deref());
            let (uid, gid) = user_of(image, pod, container);
            let groups = supplementary_groups(pod);
            let record = json!({
                "ran": "image", "image": image.reference, "digest": image.digest,
                "rootfs": image.rootfs, "user": format!("{uid}:{gid}"), "groups": groups, "argv": argv,
                "mounts": mounts.iter().map(|m| &m.target).collect::<Vec<_>>(),
            });
            // The image's environment, the container's over it.
            let own: Vec<String> = env.iter().map(|(k, _)| k.clone()).collect();
            env.splice(
                0..0,
                image.env.iter().filter(|(k, _)| !own.contains(k)).cloned(),
            );
            let enter = [
                "--mount".to_owned(),
                "--propagation".into(),
                "private".into(),
                "--".into(),
                image.launcher.display().to_string(),
            ]
            .into_iter()
            .chain(crate::image::ENTER_COMMAND.iter().map(|s| (*s).to_owned()))
            .chain([
                "--root".into(),
                image.rootfs.display().to_string(),
                "--user".into(),
                format!("{uid}:{gid}"),
                "--workdir".into(),
                container
                    .working_dir
                    .clone()
                    .unwrap_or(image.workdir.clone()),
            ])
            .chain(
                groups
                    .iter()
                    .flat_map(|g| ["--groups".to_owned(), g.to_string()]),
            )
            .chain(mounts.iter().flat_map(|m| {
                let flag = if m.read_only { "--bind-ro" } else { "--bind" };
                [
                    flag.to_owned(),
                    m.source.display().to_string(),
                    m.target.clone(),
                ]
            }))
            .chain(["--".into()])
            .chain(argv)
            .collect();
            (PathBuf::from("unshare"), enter, record)
        }
    }
}

/// Who a container of `image` runs as: its security context's user, else the image's,
/// else root.
pub(super) fn user_of(image: &crate::image::Image, pod: &Pod, container: &Container) -> (u32, u32) {
    run_as(pod, container).unwrap_or(image.user.unwrap_or((0, 0)))
}

/// The groups a pod's processes are in beside their own: its `fsGroup` (which its
/// volumes' files belong to) and its `supplementalGroups`.
pub(super) fn supplementary_groups(pod: &Pod) -> Vec<u32> {
    let context = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    super::volumes::fs_group(pod)
        .into_iter()
        .chain(
            context
                .and_then(|c| c.supplemental_groups.clone())
                .into_iter()
                .flatten()
                .filter_map(|g| u32::try_from(g).ok()),
        )
        .collect()
}

/// Whether the container would run as root: an image's user (or its security
/// context's), or a local binary with no user named.
pub(super) fn runs_as_root(runs: &Runs, pod: &Pod, container: &Container) -> bool {
    match runs {
        Runs::Image(image) => user_of(image, pod, container).0 == 0,
        Runs::Binary { user, .. } => run_as(pod, container)
            .or(*user)
            .is_none_or(|(uid, _)| uid == 0),
    }
}

/// Whether the container's or the pod's security context says `runAsNonRoot: true`.
pub(super) fn non_root_asked(pod: &Pod, container: &Container) -> bool {
    let own = container
        .security_context
        .as_ref()
        .and_then(|c| c.run_as_non_root);
    let pod_wide = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.run_as_non_root);
    own.or(pod_wide).unwrap_or(false)
}

/// The user and group the pod's or the container's security context asks for (the
/// container's over the pod's), if it names a user.
pub(super) fn run_as(pod: &Pod, container: &Container) -> Option<(u32, u32)> {
    let pod_context = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let own = container.security_context.as_ref();
    let uid = own
        .and_then(|c| c.run_as_user)
        .or(pod_context.and_then(|c| c.run_as_user))?;
    let gid = own
        .and_then(|c| c.run_as_group)
        .or(pod_context.and_then(|c| c.run_as_group))
        .unwrap_or(uid);
    Some((u32::try_from(uid).ok()?, u32::try_from(gid).ok()?))
}

/// The container's environment: plain values, keys of `secrets` (by Secret name) that
/// `secretKeyRef` names, and the pod fields `fieldRef` can name.
pub(super) fn environment(
    container: &Container,
    pod: &Pod,
    ip: IpAddr,
    node: &str,
    secrets: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for var in container.env.iter().flatten() {
        let secret = var
            .value_from
            .as_ref()
            .and_then(|f| f.secret_key_ref.as_ref());
        let value = match (&var.value, &var.value_from, secret) {
            (Some(v), _, _) => v.clone(),
            (None, _, Some(r)) => secrets
                .get(&r.name)
                .and_then(|data| data.get(&r.key))
                .cloned()
                .unwrap_or_default(),
            (None, Some(from), None) => from
                .field_ref
                .as_ref()
                .map(|f| field(pod, ip, node, &f.field_path))
                .unwrap_or_default(),
            _ => String::new(),
        };
        env.push((var.name.clone(), value));
    }
    env
}

/// The pod's field at `path`, as `fieldRef` names it (in a variable or a downward API
/// volume): its name, namespace, uid, address, node, or an annotation or label
/// (`metadata.annotations['key']`: a Job's completion index comes this way).
pub(super) fn field(pod: &Pod, ip: IpAddr, node: &str, path: &str) -> String {
    match path {
        "metadata.name" => pod_name(pod).to_owned(),
        "metadata.namespace" => pod_ns(pod).to_owned(),
        "metadata.uid" => pod.metadata.uid.clone().unwrap_or_default(),
        "status.podIP" => ip.to_string(),
        "spec.nodeName" => node.to_owned(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        path => {
            let item = |prefix: &str| {
                path.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_suffix("']"))
                    .map(str::to_owned)
            };
            let m = &pod.metadata;
            match (item("metadata.annotations['"), item("metadata.labels['")) {
                (Some(key), _) => m.annotations.as_ref().and_then(|a| a.get(&key)).cloned(),
                (_, Some(key)) => m.labels.as_ref().and_then(|l| l.get(&key)).cloned(),
                _ => None,
            }
            .unwrap_or_default()
        }
    }
}

/// Sets the pod's sysctls in its own network namespace, as the kubelet sets them in the
/// pod's sandbox; one the kernel will not take (or any, on the host's network, where
/// they would change the node's own) is the reason the pod does not start.
pub(super) fn pod_sysctls(
    pod: &Pod,
    place: &ingressbench_lab::topology::Node,
) -> Result<(), String> {
    let sysctls: ingressbench_lab::kernel::Sysctls = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    if sysctls.is_empty() {
        return Ok(());
    }
    let name = pod_name(pod);
    ingressbench_lab::kernel::check_namespaced(sysctls.keys().map(String::as_str))
        .and_then(|()| match place.netns.as_deref() {
            Some(ns) => ingressbench_lab::kernel::apply(name, ns, &sysctls),
            None => Err(ingressbench_lab::LabError::Kernel {
                node: name.to_owned(),
                setting: sysctls.keys().cloned().collect::<Vec<_>>().join(", "),
                reason: "a pod on the host's network cannot set namespaced sysctls".into(),
            }),
        })
        .map_err(|e| e.to_string())
}

/// Where a container's HTTP readiness probe asks, and its path (a named port is the
/// container's port of that name).
pub(super) fn probe_of(container: &Container, ip: IpAddr) -> (Option<SocketAddr>, String) {
    let Some(http) = container
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
    else {
        return (None, String::new());
    };
    (
        Some(SocketAddr::new(
            ip,
            super::lifecycle::port_of(container, &http.port),
        )),
        http.path.clone().unwrap_or_else(|| "/".into()),
    )
}

pub(super) fn pod_ns(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

pub(super) fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}
