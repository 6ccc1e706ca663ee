//! A pod's volumes as the kubelet makes them: Secrets, ConfigMaps, empty directories and
//! projected volumes (Secrets, ConfigMaps, the pod's own fields, and service-account
//! tokens asked of the API for the pod, renewed at 80% of their life) written as files in
//! a directory of the pod's, and the mounts of each container: the volume's directory
//! (or a `subPath` in it) at the container's `mountPath`, read-only where the kubelet
//! mounts it so (every Secret, ConfigMap and projected volume, and any mount that asks).
//!
//! A volume that cannot be made yet (its Secret or ConfigMap does not exist: a Job makes
//! it later, as Envoy Gateway's certgen does) keeps the pod waiting in
//! `ContainerCreating`, tried again, as the kubelet does. A kind of volume the agent does
//! not make (a host path, a claim) is the reason the pod does not start.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::pod::{field, pod_name, pod_ns};

/// The mode of a volume's files when the pod names none (the kubelet's `0644`).
const DEFAULT_MODE: u32 = 0o644;
/// A projected token's life when the pod names none (the API's default, one hour).
const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// Why a pod's volumes are not made: it waits and is tried again, or it cannot start.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotMade {
    /// Something it needs does not exist yet (the kubelet's `FailedMount`): try again.
    Waiting(String),
    /// It never will be (a kind of volume the agent does not make, a path that leaves
    /// the volume).
    Refused(String),
}

/// A pod's volumes, made: each one's directory, and the tokens to renew.
#[derive(Debug, Default)]
pub(super) struct Volumes {
    /// The pod's volume directory (removed with the pod).
    pub dir: PathBuf,
    made: BTreeMap<String, Made>,
    tokens: Vec<Token>,
}

#[derive(Debug)]
struct Made {
    path: PathBuf,
    /// Whether the kubelet mounts it read-only whatever the mount says.
    read_only: bool,
}

/// A projected service-account token: where it is written and how to ask for the next.
#[derive(Debug)]
struct Token {
    file: PathBuf,
    mode: u32,
    /// The pod it is bound to: namespace, name, uid.
    pod: (String, String, Option<String>),
    service_account: String,
    /// The pod's `fsGroup`, which the file belongs to.
    group: Option<u32>,
    audience: Option<String>,
    seconds: i64,
    renew_at: Instant,
}

/// One mount of a container: what, where in its root, read-only or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

impl Volumes {
    /// Makes every volume of `pod` under `dir` (created; removed again if a volume
    /// cannot be made), reading Secrets and ConfigMaps and asking for tokens through
    /// `client`.
    pub(super) async fn make(
        client: &Client,
        pod: &Pod,
        ip: std::net::IpAddr,
        node: &str,
        dir: PathBuf,
    ) -> Result<Volumes, NotMade> {
        let mut volumes = Volumes {
            dir,
            ..Volumes::default()
        };
        let mut made = volumes.make_all(client, pod, ip, node).await;
        if let (Ok(()), Some(group)) = (&made, fs_group(pod)) {
            made = give_group(&volumes.dir, group);
        }
        if made.is_err() {
            volumes.remove();
        }
        made.map(|()| volumes)
    }

    async fn make_all(
        &mut self,
        client: &Client,
        pod: &Pod,
        ip: std::net::IpAddr,
        node: &str,
    ) -> Result<(), NotMade> {
        let specs: &[Volume] = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_deref())
            .unwrap_or(&[]);
        let ns = pod_ns(pod);
        for volume in specs {
            let path = self.dir.join(&volume.name);
            make_dir(&path, 0o755)?;
            let read_only = if let Some(s) = &volume.secret {
                let name = s.secret_name.clone().unwrap_or_default();
                let data = secret_data(client, ns, &name, s.optional).await?;
                let mode = mode_of(s.default_mode);
                write_keys(&path, &data, s.items.as_deref(), mode, "Secret", &name)?;
                true
            } else if let Some(c) = &volume.config_map {
                let data = config_map_data(client, ns, &c.name, c.optional).await?;
                let mode = mode_of(c.default_mode);
                write_keys(&path, &data, c.items.as_deref(), mode, "ConfigMap", &c.name)?;
                true
            } else if volume.empty_dir.is_some() {
                // Writable by whoever the containers run as, as the kubelet makes it.
                set_mode(&path, 0o777)?;
                false
            } else if let Some(p) = &volume.projected {
                let mode = mode_of(p.default_mode);
                for source in p.sources.iter().flatten() {
                    if let Some(s) = &source.secret {
                        let data = secret_data(client, ns, &s.name, s.optional).await?;
                        write_keys(&path, &data, s.items.as_deref(), mode, "Secret", &s.name)?;
                    } else if let Some(c) = &source.config_map {
                        let data = config_map_data(client, ns, &c.name, c.optional).await?;
                        write_keys(&path, &data, c.items.as_deref(), mode, "ConfigMap", &c.name)?;
                    } else if let Some(d) = &source.downward_api {
                        for item in d.items.iter().flatten() {
                            let Some(f) = &item.field_ref else {
                                return Err(NotMade::Refused(format!(
                                    "volume {}: the node agent writes a downward API item's fieldRef, not its resourceFieldRef ({})",
                                    volume.name, item.path
                                )));
                            };
                            let value = field(pod, ip, node, &f.field_path);
                            write_file(
                                &path,
                                &item.path,
                                value.as_bytes(),
                                mode_of(item.mode).min(mode),
                            )?;
                        }
                    } else if let Some(t) = &source.service_account_token {
                        let mut token = Token {
                            file: inside(&path, &t.path)?,
                            mode,
                            pod: (
                                ns.to_owned(),
                                pod_name(pod).to_owned(),
                                pod.metadata.uid.clone(),
                            ),
                            service_account: service_account(pod),
                            group: fs_group(pod),
                            audience: t.audience.clone().filter(|a| !a.is_empty()),
                            seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
                            renew_at: Instant::now(),
                        };
                        token.renew(client).await?;
                        self.tokens.push(token);
                    } else {
                        return Err(NotMade::Refused(format!(
                            "volume {}: a projected source the node agent does not make (it makes secret, configMap, downwardAPI and serviceAccountToken)",
                            volume.name
                        )));
                    }
                }
                true
            } else {
                return Err(NotMade::Refused(format!(
                    "volume {}: the ingressbench node agent makes Secret, ConfigMap, emptyDir and projected volumes, not this kind",
                    volume.name
                )));
            };
            self.made
                .insert(volume.name.clone(), Made { path, read_only });
        }
        Ok(())
    }

    /// The mounts of `container`, in its order: each names a volume of the pod.
    pub(super) fn mounts(&self, container: &Container) -> Result<Vec<Mount>, String> {
        container
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| {
                let made = self.made.get(&m.name).ok_or_else(|| {
                    format!(
                        "container {} mounts volume {}, which the pod does not have",
                        container.name, m.name
                    )
                })?;
                let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                    Some(sub) => inside(&made.path, sub).map_err(|e| match e {
                        NotMade::Waiting(s) | NotMade::Refused(s) => s,
                    })?,
                    None => made.path.clone(),
                };
                Ok(Mount {
                    source,
                    target: m.mount_path.clone(),
                    read_only: made.read_only || m.read_only == Some(true),
                })
            })
            .collect()
    }

    /// Asks for the tokens due for renewal (at 80% of their life) and writes them over
    /// the old ones; one the API refuses is tried again at the next look.
    pub(super) async fn renew_tokens(&mut self, client: &Client) {
        for token in &mut self.tokens {
            if Instant::now() >= token.renew_at {
                let _ = token.renew(client).await;
            }
        }
    }

    /// Removes the volumes' files.
    pub(super) fn remove(&self) {
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Token {
    /// Asks the API for a token bound to the pod and writes it (replacing the file, so a
    /// reader never sees half of one).
    async fn renew(&mut self, client: &Client) -> Result<(), NotMade> {
        let (ns, name, uid) = &self.pod;
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: self.audience.iter().cloned().collect(),
                expiration_seconds: Some(self.seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name.clone()),
                    uid: uid.clone(),
                }),
            },
            ..TokenRequest::default()
        };
        let answer = api
            .create_token_request(&self.service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                NotMade::Waiting(format!(
                    "a token of service account {ns}/{}: {e}",
                    self.service_account
                ))
            })?;
        let token = answer.status.map(|s| s.token).unwrap_or_default();
        let tmp = self.file.with_extension("renewing");
        write_bytes(&tmp, token.as_bytes(), self.mode)?;
        if let Some(group) = self.group {
            give_group_of(&tmp, group)?;
        }
        std::fs::rename(&tmp, &self.file)
            .map_err(|e| NotMade::Refused(format!("{}: {e}", self.file.display())))?;
        self.renew_at = Instant::now() + renewal_after(self.seconds);
        Ok(())
    }
}

/// The pod's `fsGroup`: the group its volumes' files belong to (and that its containers'
/// processes are in), so that a user other than root reads a file of mode `0440`.
pub(super) fn fs_group(pod: &Pod) -> Option<u32> {
    let group = pod.spec.as_ref()?.security_context.as_ref()?.fs_group?;
    u32::try_from(group).ok()
}

/// Gives every file and directory under `dir` to `group` (the owner stays root).
fn give_group(dir: &Path, group: u32) -> Result<(), NotMade> {
    give_group_of(dir, group)?;
    let entries =
        std::fs::read_dir(dir).map_err(|e| NotMade::Refused(format!("{}: {e}", dir.display())))?;
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => give_group(&path, group)?,
            _ => give_group_of(&path, group)?,
        }
    }
    Ok(())
}

fn give_group_of(path: &Path, group: u32) -> Result<(), NotMade> {
    std::os::unix::fs::lchown(path, None, Some(group))
        .map_err(|e| NotMade::Refused(format!("giving {} to group {group}: {e}", path.display())))
}

/// When a token of `seconds` is renewed: at 80% of its life, as the kubelet does.
fn renewal_after(seconds: i64) -> Duration {
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0) * 4 / 5)
}

/// The pod's service account (`default` when it names none).
fn service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into())
}

fn mode_of(mode: Option<i32>) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok())
        .map_or(DEFAULT_MODE, |m| m & 0o777)
}

async fn secret_data(
    client: &Client,
    ns: &str,
    name: &str,
    optional: Option<bool>,
) -> Result<BTreeMap<String, Vec<u8>>, NotMade> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(s)) => Ok(s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect()),
        Ok(None) if optional == Some(true) => Ok(BTreeMap::new()),
        Ok(None) => Err(NotMade::Waiting(format!(
            "MountVolume.SetUp failed: secret \"{name}\" not found"
        ))),
        Err(e) => Err(NotMade::Waiting(format!("secret \"{name}\": {e}"))),
    }
}

async fn config_map_data(
    client: &Client,
    ns: &str,
    name: &str,
    optional: Option<bool>,
) -> Result<BTreeMap<String, Vec<u8>>, NotMade> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(c)) => {
            let mut data: BTreeMap<String, Vec<u8>> = c
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            data.extend(
                c.binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            Ok(data)
        }
        Ok(None) if optional == Some(true) => Ok(BTreeMap::new()),
        Ok(None) => Err(NotMade::Waiting(format!(
            "MountVolume.SetUp failed: configmap \"{name}\" not found"
        ))),
        Err(e) => Err(NotMade::Waiting(format!("configmap \"{name}\": {e}"))),
    }
}

/// Writes a Secret's or ConfigMap's keys into `dir`: every key as a file of its name, or
/// only the `items` named (each at its path, with its mode). A named key the object lacks
/// keeps the pod waiting, as the kubelet's mount fails.
fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    mode: u32,
    kind: &str,
    name: &str,
) -> Result<(), NotMade> {
    match items {
        None => data
            .iter()
            .try_for_each(|(key, value)| write_file(dir, key, value, mode)),
        Some(items) => items.iter().try_for_each(|item| {
            let value = data.get(&item.key).ok_or_else(|| {
                NotMade::Waiting(format!(
                    "MountVolume.SetUp failed: {kind} {name} has no key {}",
                    item.key
                ))
            })?;
            write_file(
                dir,
                &item.path,
                value,
                item.mode.map_or(mode, |m| mode_of(Some(m))),
            )
        }),
    }
}

/// Writes `relative` (a path that stays inside `dir`) under `dir`.
fn write_file(dir: &Path, relative: &str, value: &[u8], mode: u32) -> Result<(), NotMade> {
    let path = inside(dir, relative)?;
    if let Some(parent) = path.parent() {
        make_dir(parent, 0o755)?;
    }
    write_bytes(&path, value, mode)
}

fn write_bytes(path: &Path, value: &[u8], mode: u32) -> Result<(), NotMade> {
    std::fs::write(path, value)
        .and_then(|()| {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
        })
        .map_err(|e| NotMade::Refused(format!("writing {}: {e}", path.display())))
}

fn make_dir(path: &Path, mode: u32) -> Result<(), NotMade> {
    std::fs::create_dir_all(path)
        .map_err(|e| NotMade::Refused(format!("making {}: {e}", path.display())))?;
    set_mode(path, mode)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), NotMade> {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .map_err(|e| NotMade::Refused(format!("{}: {e}", path.display())))
}

/// `dir/relative`, refused when `relative` is absolute or climbs out (`..`), as the API
/// refuses such a path.
fn inside(dir: &Path, relative: &str) -> Result<PathBuf, NotMade> {
    let path = Path::new(relative);
    let stays = !relative.is_empty()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !stays {
        return Err(NotMade::Refused(format!(
            "`{relative}` is not a relative path inside the volume"
        )));
    }
    Ok(dir.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_volume() {
        let dir = Path::new("/v");
        assert_eq!(inside(dir, "a/b.crt").unwrap(), Path::new("/v/a/b.crt"));
        for bad in ["", "/etc/passwd", "../x", "a/../../x"] {
            assert!(
                matches!(inside(dir, bad), Err(NotMade::Refused(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn keys_become_files_with_their_modes_and_a_missing_key_waits() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ib-volumes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let data: BTreeMap<String, Vec<u8>> = [
            ("tls.crt".to_owned(), b"cert".to_vec()),
            ("tls.key".to_owned(), b"key".to_vec()),
        ]
        .into();
        let all = dir.join("all");
        make_dir(&all, 0o755).unwrap();
        write_keys(&all, &data, None, 0o640, "Secret", "s").unwrap();
        assert_eq!(std::fs::read(all.join("tls.key")).unwrap(), b"key");
        let mode = std::fs::metadata(all.join("tls.crt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        let some = dir.join("some");
        make_dir(&some, 0o755).unwrap();
        let item = |key: &str, path: &str, mode: Option<i32>| KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        };
        write_keys(
            &some,
            &data,
            Some(&[item("tls.crt", "certs/server.crt", Some(0o600))]),
            DEFAULT_MODE,
            "Secret",
            "s",
        )
        .unwrap();
        assert_eq!(
            std::fs::read(some.join("certs/server.crt")).unwrap(),
            b"cert"
        );
        assert!(!some.join("tls.key").exists());
        let mode = std::fs::metadata(some.join("certs/server.crt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let missing = write_keys(
            &some,
            &data,
            Some(&[item("ca.crt", "ca.crt", None)]),
            0o644,
            "Secret",
            "s",
        );
        assert!(matches!(missing, Err(NotMade::Waiting(m)) if m.contains("no key ca.crt")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tokens_are_renewed_at_four_fifths_of_their_life() {
        assert_eq!(renewal_after(3600), Duration::from_secs(2880));
        assert_eq!(renewal_after(-1), Duration::ZERO);
    }

    #[test]
    fn a_mount_of_a_secret_is_read_only_and_a_sub_path_stays_inside() {
        let mut volumes = Volumes::default();
        volumes.made.insert(
            "certs".into(),
            Made {
                path: "/v/certs".into(),
                read_only: true,
            },
        );
        volumes.made.insert(
            "scratch".into(),
            Made {
                path: "/v/scratch".into(),
                read_only: false,
            },
        );
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "volumeMounts": [
                { "name": "certs", "mountPath": "/certs" },
                { "name": "scratch", "mountPath": "/tmp" },
                { "name": "scratch", "mountPath": "/ro", "readOnly": true, "subPath": "sub" },
            ],
        }))
        .unwrap();
        let mounts = volumes.mounts(&container).unwrap();
        let got: Vec<(&str, &str, bool)> = mounts
            .iter()
            .map(|m| (m.source.to_str().unwrap(), m.target.as_str(), m.read_only))
            .collect();
        assert_eq!(
            got,
            [
                ("/v/certs", "/certs", true),
                ("/v/scratch", "/tmp", false),
                ("/v/scratch/sub", "/ro", true),
            ]
        );
        let stray: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "volumeMounts": [{ "name": "nope", "mountPath": "/x" }],
        }))
        .unwrap();
        assert!(volumes
            .mounts(&stray)
            .unwrap_err()
            .contains("does not have"));
    }
}
