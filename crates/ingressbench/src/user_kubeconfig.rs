//! The local cluster in the user's kubeconfig, as kind does it: `cluster local up` adds a
//! cluster, a user and a context named [`NAME`] to the kubeconfig `kubectl` would read
//! (the first file of `KUBECONFIG`, else `~/.kube/config`) and makes that context the
//! current one, or writes the file when there is none; `down` takes out what `up` added
//! and gives back the context that was current. What was done is recorded in the
//! cluster's directory ([`RECORD`]), so that `down` touches nothing else.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};

/// The name of the cluster, the user and the context `up` adds.
pub(crate) const NAME: &str = "ingressbench-local";
/// Where `up` records what it did to the user's kubeconfig.
const RECORD: &str = "user-kubeconfig.json";

/// The kubeconfig `kubectl` would read, when there is a home or a `KUBECONFIG`.
pub(crate) fn users() -> Option<PathBuf> {
    match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        // kubectl writes to the first file of the list.
        Some(list) => std::env::split_paths(&list).next(),
        None => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config")),
    }
}

/// Adds the local cluster's entries from `ours` (the cluster's own kubeconfig) to
/// `theirs`, makes its context current and records it in `dir`. Says what it did.
pub(crate) fn add(dir: &Path, ours: &Path, theirs: &Path) -> Result<String> {
    let ours_doc = read(ours)?;
    let created = !theirs.exists();
    let mut doc = if created {
        json!({ "apiVersion": "v1", "kind": "Config", "preferences": {} })
    } else {
        read(theirs)?
    };
    let previous = doc["current-context"]
        .as_str()
        .filter(|p| *p != NAME)
        .map(str::to_owned);
    for list in ["clusters", "users", "contexts"] {
        let entries = without_ours(&doc[list]);
        let added = ours_doc[list].as_array().cloned().unwrap_or_default();
        doc[list] = Value::Array(entries.into_iter().chain(added).collect());
    }
    doc["current-context"] = json!(NAME);
    write(theirs, &doc)?;
    let record = json!({
        "path": theirs, "created": created,
        "previous_context": previous,
    });
    std::fs::write(dir.join(RECORD), format!("{record:#}\n"))?;
    Ok(if created {
        format!("kubeconfig: wrote {} (context {NAME})", theirs.display())
    } else {
        format!(
            "kubeconfig: added context {NAME} to {} and made it current{}",
            theirs.display(),
            previous
                .map(|p| format!(" (was {p}; `down` gives it back)"))
                .unwrap_or_default()
        )
    })
}

/// Takes out of the user's kubeconfig what [`add`] recorded in `dir` it put there; the
/// file itself when `add` made it and nothing else is in it. Says what it did.
pub(crate) fn remove(dir: &Path) -> Result<Option<String>> {
    let Ok(text) = std::fs::read_to_string(dir.join(RECORD)) else {
        return Ok(None);
    };
    let record: Value = serde_json::from_str(&text)?;
    let Some(path) = record["path"].as_str().map(PathBuf::from) else {
        return Ok(None);
    };
    if !path.is_file() {
        return Ok(None);
    }
    let mut doc = read(&path)?;
    for list in ["clusters", "users", "contexts"] {
        doc[list] = Value::Array(without_ours(&doc[list]));
    }
    if doc["current-context"] == json!(NAME) {
        doc["current-context"] = record["previous_context"].clone();
        if doc["current-context"].is_null() {
            doc.as_object_mut().map(|o| o.remove("current-context"));
        }
    }
    let empty = ["clusters", "users", "contexts"]
        .iter()
        .all(|l| doc[l].as_array().is_none_or(Vec::is_empty));
    if record["created"] == json!(true) && empty {
        std::fs::remove_file(&path)?;
        return Ok(Some(format!("kubeconfig: removed {}", path.display())));
    }
    write(&path, &doc)?;
    Ok(Some(format!(
        "kubeconfig: took context {NAME} out of {}",
        path.display()
    )))
}

fn without_ours(list: &Value) -> Vec<Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"] != json!(NAME))
        .cloned()
        .collect()
}

fn read(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    if text.trim().is_empty() {
        return Ok(json!({ "apiVersion": "v1", "kind": "Config" }));
    }
    let doc: Value = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("{} is not a kubeconfig (YAML)", path.display()))?;
    anyhow::ensure!(
        doc.is_object(),
        "{} is not a kubeconfig (not a mapping); give the cluster a kubeconfig of its own with KUBECONFIG=FILE",
        path.display()
    );
    Ok(doc)
}

/// Writes `doc` as YAML, private to its owner, by rename (a reader never sees half).
fn write(path: &Path, doc: &Value) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let text = serde_yaml_ng::to_string(doc)?;
    let tmp = path.with_extension("ingressbench-tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The kubeconfig to use: the flag, else `KUBECONFIG`, else `~/.kube/config`.
pub(crate) fn chosen_kubeconfig(flag: Option<&Path>) -> Result<PathBuf> {
    let path = flag
        .map(Path::to_owned)
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config")))
        .ok_or_else(|| {
            crate::UsageError(anyhow::anyhow!(
                "no kubeconfig: give --kubeconfig or set KUBECONFIG"
            ))
        })?;
    if !path.is_file() {
        return Err(crate::UsageError(anyhow::anyhow!(
            "kubeconfig {} does not exist; give --kubeconfig or set KUBECONFIG (for the local test cluster: ingressbench cluster local kubeconfig)",
            path.display()
        ))
        .into());
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_adds_a_context_beside_the_users_own_and_down_gives_the_old_one_back() {
        let dir = std::env::temp_dir().join(format!("ib-kubeconfig-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ours = dir.join("ours");
        std::fs::write(
            &ours,
            json!({
                "clusters": [{ "name": NAME, "cluster": { "server": "https://127.0.0.1:1" } }],
                "users": [{ "name": NAME, "user": { "token": "t" } }],
                "contexts": [{ "name": NAME, "context": { "cluster": NAME, "user": NAME } }],
                "current-context": NAME,
            })
            .to_string(),
        )
        .unwrap();
        let theirs = dir.join("kube/config");
        std::fs::create_dir_all(theirs.parent().unwrap()).unwrap();
        let before = "apiVersion: v1\nkind: Config\nclusters:\n- name: prod\n  cluster: { server: https://prod.example }\nusers:\n- name: me\n  user: { token: x }\ncontexts:\n- name: prod\n  context: { cluster: prod, user: me }\ncurrent-context: prod\n";
        std::fs::write(&theirs, before).unwrap();
        let said = add(&dir, &ours, &theirs).unwrap();
        assert!(said.contains("was prod"), "{said}");
        let doc = read(&theirs).unwrap();
        assert_eq!(doc["current-context"], json!(NAME));
        assert_eq!(doc["contexts"].as_array().unwrap().len(), 2);
        assert_eq!(doc["clusters"][0]["name"], json!("prod"));
        remove(&dir).unwrap();
        let doc = read(&theirs).unwrap();
        assert_eq!(doc["current-context"], json!("prod"));
        assert_eq!(doc["contexts"].as_array().unwrap().len(), 1);
        assert_eq!(doc["users"][0]["name"], json!("me"));
        // No kubeconfig at all: the file is written, and removed again.
        std::fs::remove_file(&theirs).unwrap();
        add(&dir, &ours, &theirs).unwrap();
        assert_eq!(read(&theirs).unwrap()["current-context"], json!(NAME));
        remove(&dir).unwrap();
        assert!(!theirs.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
