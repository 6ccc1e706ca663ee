//! What the local cluster's node agent does as a kubelet does for pods the tool did not
//! make (a chart's controller, the data plane a controller creates): their volumes.

use std::path::Path;
use std::process::Command;

use crate::cluster::{backend_via, tail, wait_for, wait_until, waiting_because};
use crate::common::{scratch, BIN};

/// `cluster local enter` mounts each `--bind` at its path inside the root, the
/// `--bind-ro` ones read-only, a container's `/dev` and a `/tmp` of its own, for the
/// command it runs (as the unprivileged user), in a mount namespace of its own (the host
/// sees none of them) and a PID namespace where the command is process 1; a SIGTERM to
/// `enter` reaches the command, and `enter` ends as it did.
#[test]
fn enter_mounts_volumes_inside_the_root_read_only_where_asked() {
    let dir = scratch("enter-mounts");
    // A root filesystem with a shell (dash and the libraries it links), as an image has.
    let root = dir.join("root");
    for file in [
        "/bin/dash",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    ] {
        let to = root.join(file.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(std::fs::canonicalize(file).unwrap(), &to).unwrap();
    }
    std::fs::create_dir(root.join("proc")).unwrap();
    std::fs::create_dir(root.join("tmp")).unwrap();
    let (rw, ro) = (dir.join("rw"), dir.join("ro"));
    for d in [&rw, &ro] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("said"), "from the volume\n").unwrap();
    }
    // Writable by the container's user, as an emptyDir is.
    Command::new("chmod")
        .args(["0777"])
        .arg(&rw)
        .status()
        .unwrap();
    // A runtime's /dev too: the usual nodes, shared memory, and the output the user may
    // open again (Envoy's access log opens /dev/stdout). Shell builtins only.
    let script = "test $$ = 1 && test -d /proc/1/fd && echo mine > /tmp/t \
        && echo dropped > /dev/null && test -c /dev/urandom && echo shm > /dev/shm/t \
        && read shm < /dev/shm/t && test \"$shm\" = shm && printf '' > /dev/stdout \
        && read a < /data/rw/said && echo \"$a\" && : > /data/rw/written \
        && read b < /data/ro/said && echo \"$b\" && : > /data/ro/refused";
    let enter = |root: &Path, binds: &[(&str, &Path, &str)], argv: &[&str]| {
        // As the node agent starts it.
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private"])
            .arg("--")
            .arg(BIN)
            .args(["cluster", "local", "enter", "--root"])
            .arg(root)
            .args(["--user", "65532:65532"]);
        for (flag, source, target) in binds {
            c.arg(flag).arg(source).arg(target);
        }
        c.arg("--").args(argv).output().unwrap()
    };
    let out = enter(
        &root,
        &[("--bind", &rw, "/data/rw"), ("--bind-ro", &ro, "/data/ro")],
        &["/bin/dash", "-c", script],
    );
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(said, "from the volume\nfrom the volume\n", "{err}");
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(!out.status.success());
    // The writable one took the file; the mount points and /dev stay empty outside.
    assert!(rw.join("written").exists());
    assert!(!ro.join("refused").exists());
    assert_eq!(std::fs::read_dir(root.join("data/ro")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(root.join("dev")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(root.join("tmp")).unwrap().count(), 0);
    // SIGTERM to `enter` reaches the command, process 1 of its namespace, which has a
    // handler for it (as a container's must: process 1 ignores what it does not handle).
    let running = Command::new(BIN)
        .args(["cluster", "local", "enter", "--root"])
        .arg(&root)
        .args(["--user", "65532:65532", "--"])
        .args([
            "/bin/dash",
            "-c",
            "trap 'echo terminated; exit 7' TERM; echo > /tmp/started; while :; do :; done",
        ])
        // Both piped: `enter` hands its output to the container's user, which must not
        // be this test's own (it was: the CI log changed hands).
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Started once its /tmp has the file: seen through /proc, from its children.
    let pid = running.id();
    wait_until("the command running", || {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        let child = children.split_whitespace().next()?.to_owned();
        std::path::Path::new(&format!("/proc/{child}/root/tmp/started"))
            .exists()
            .then_some(())
    });
    assert!(Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let out = running.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "terminated\n");
    // A target that climbs out of the root is refused before anything runs, and so is
    // the node's own root.
    let out = enter(
        &root,
        &[("--bind", &rw, "/../../etc")],
        &["/bin/dash", "-c", "true"],
    );
    assert_eq!(out.status.code(), Some(127), "{}", tail(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("without `..`"),
        "{}",
        tail(&out)
    );
    let out = enter(Path::new("/"), &[], &["/bin/true"]);
    assert_eq!(out.status.code(), Some(127), "{}", tail(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("node's own"),
        "{}",
        tail(&out)
    );
    // Run straight from the node's mount namespace, it makes one of its own: none of its
    // mounts is the node's.
    let out = Command::new(BIN)
        .args(["cluster", "local", "enter", "--root"])
        .arg(&root)
        .args(["--user", "65532:65532", "--bind"])
        .arg(&rw)
        .args([
            "/data/rw",
            "--",
            "/bin/dash",
            "-c",
            "read a < /data/rw/said",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", tail(&out));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&root.display().to_string()), "{mounts}");
}

/// A pod's Secret, ConfigMap, emptyDir and projected volumes are made as the kubelet
/// makes them: it waits in `ContainerCreating` while its Secret does not exist (as a
/// chart's pod waits for the Secret its Job writes), starts once it does, and serves with
/// the files mounted (here: a TLS backend with its key from the Secret and the CA it asks
/// clients for from the ConfigMap). Its service-account token is one the API server
/// accepts, bound to the pod. Deleted, its files go.
pub(crate) fn a_pods_volumes_are_made_as_the_kubelet_makes_them(dir: &Path) {
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
    use kube::api::{DeleteParams, PostParams};
    let config = dir.join("cluster/kubeconfig");
    let pki = scratch("kubelet-volumes");
    let tls = make_pki(&pki);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = ingressbench_cluster::api::client(&config, None).await.unwrap();
        let ns = "volumes";
        let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
        namespaces
            .create(&PostParams::default(), &serde_json::from_value(serde_json::json!({ "metadata": { "name": ns } })).unwrap())
            .await
            .unwrap();
        // Its service account comes with the namespace (the controller manager's work).
        let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(client.clone(), ns);
        wait_for("the namespace's default service account", async || {
            accounts.get_opt("default").await.unwrap()
        })
        .await;
        let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "tls-echo" },
            "spec": {
                "terminationGracePeriodSeconds": 2,
                // The files' group: the container's user is in it besides its own.
                "securityContext": { "fsGroup": 2000 },
                "containers": [{
                    "name": "echo", "image": "example.test/ingressbench:dev",
                    "args": ["backend", "--listen", "0.0.0.0:8443", "--name", "tls-echo",
                        "--tls-cert", "/certs/server.crt", "--tls-key", "/certs/server.key",
                        "--client-ca", "/trust/ca.crt"],
                    "volumeMounts": [
                        { "name": "certs", "mountPath": "/certs" },
                        { "name": "trust", "mountPath": "/trust" },
                        { "name": "scratch", "mountPath": "/scratch" },
                        { "name": "pod-info", "mountPath": "/etc/pod-info" },
                    ],
                }],
                "volumes": [
                    { "name": "certs", "secret": { "secretName": "echo-tls", "defaultMode": 0o440, "items": [
                        { "key": "tls.crt", "path": "server.crt" }, { "key": "tls.key", "path": "server.key" }] } },
                    { "name": "trust", "configMap": { "name": "echo-trust" } },
                    { "name": "scratch", "emptyDir": {} },
                    { "name": "pod-info", "projected": { "sources": [
                        { "downwardAPI": { "items": [{ "path": "name", "fieldRef": { "fieldPath": "metadata.name" } }] } },
                        { "serviceAccountToken": { "path": "token", "audience": "volumes-test", "expirationSeconds": 3600 } },
                    ] } },
                ],
            }
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        // Waiting for its Secret, named.
        let message = wait_for("the pod waiting for its Secret", async || {
            waiting_because(&pods.list(&Default::default()).await.unwrap().items, "ContainerCreating")
        })
        .await;
        assert!(message.contains("secret \"echo-tls\" not found"), "{message}");
        // Then the ConfigMap's turn, then it starts.
        let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), ns);
        let secret = serde_json::json!({ "metadata": { "name": "echo-tls" }, "type": "kubernetes.io/tls",
            "stringData": { "tls.crt": tls.server_cert, "tls.key": tls.server_key } });
        secrets.create(&PostParams::default(), &serde_json::from_value(secret).unwrap()).await.unwrap();
        let message = wait_for("the pod waiting for its ConfigMap", async || {
            waiting_because(&pods.list(&Default::default()).await.unwrap().items, "ContainerCreating")
                .filter(|m| m.contains("configmap"))
        })
        .await;
        assert!(message.contains("configmap \"echo-trust\" not found"), "{message}");
        let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), ns);
        let map = serde_json::json!({ "metadata": { "name": "echo-trust" }, "data": { "ca.crt": tls.ca_cert } });
        maps.create(&PostParams::default(), &serde_json::from_value(map).unwrap()).await.unwrap();
        let ip = wait_for("the pod running", async || {
            let p = pods.get("tls-echo").await.unwrap();
            p.status?.pod_ip.filter(|ip| !ip.is_empty())
        })
        .await;
        // It serves TLS with the Secret's key, to a client of the ConfigMap's CA only.
        let with_client = |cert: bool| {
            let mut curl = Command::new("curl");
            curl.args(["-sS", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
                .arg(pki.join("ca.crt"))
                .args(["--resolve", &format!("tls-echo.test:8443:{ip}")]);
            if cert {
                curl.arg("--cert").arg(pki.join("client.crt")).arg("--key").arg(pki.join("client.key"));
            }
            curl.arg("https://tls-echo.test:8443/").output().unwrap()
        };
        let answered = wait_for("the pod answering over TLS", async || {
            let out = with_client(true);
            (out.stdout == b"200").then_some(out)
        })
        .await;
        assert!(answered.status.success(), "{}", tail(&answered));
        let refused = with_client(false);
        assert_ne!(refused.stdout, b"200", "{}", tail(&refused));
        // The files, as the kubelet writes them: the Secret's items at their paths and
        // modes, the pod's name, an emptyDir anyone in the pod may write, and a token
        // that the API server takes as this pod's.
        let uid = pods.get("tls-echo").await.unwrap().metadata.uid.unwrap();
        let volumes = dir.join("cluster/pods/volumes").join(&uid);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&volumes.join("certs/server.key")), 0o440);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(volumes.join("certs/server.key")).unwrap().gid(), 2000);
        assert!(!volumes.join("certs/tls.key").exists());
        assert_eq!(mode(&volumes.join("scratch")), 0o777);
        assert_eq!(std::fs::read_to_string(volumes.join("pod-info/name")).unwrap(), "tls-echo");
        let token = std::fs::read_to_string(volumes.join("pod-info/token")).unwrap();
        let reviews: kube::Api<TokenReview> = kube::Api::all(client.clone());
        let review: TokenReview = serde_json::from_value(serde_json::json!({
            "spec": { "token": token, "audiences": ["volumes-test"] } }))
        .unwrap();
        let status = reviews.create(&PostParams::default(), &review).await.unwrap().status.unwrap();
        assert_eq!(status.authenticated, Some(true), "{status:?}");
        let user = status.user.unwrap();
        assert_eq!(user.username.as_deref(), Some("system:serviceaccount:volumes:default"));
        let bound = user.extra.unwrap_or_default();
        assert_eq!(bound.get("authentication.kubernetes.io/pod-name"), Some(&vec!["tls-echo".to_owned()]), "{bound:?}");
        // Every pod's own service-account volume (the API adds it) is made too.
        let ran = std::fs::read_to_string(dir.join("cluster/pods/ran.jsonl")).unwrap();
        let record = ran.lines().rev().find(|l| l.contains("volumes/tls-echo")).unwrap();
        for at in ["/certs", "/trust", "/scratch", "/etc/pod-info", "/var/run/secrets/kubernetes.io/serviceaccount"] {
            assert!(record.contains(&format!("\"{at}\"")), "{at}: {record}");
        }
        // Deleted, the pod's files go with it.
        pods.delete("tls-echo", &DeleteParams::default()).await.unwrap();
        wait_for("the pod gone", async || pods.get_opt("tls-echo").await.unwrap().is_none().then_some(())).await;
        wait_for("its volumes gone", async || (!volumes.exists()).then_some(())).await;
        // Deleted; the parts after need not wait for it to be gone.
        namespaces.delete(ns, &DeleteParams::default()).await.unwrap();
    });
}

/// A CA, a server certificate from it for `tls-echo.test` and a client certificate, in
/// `dir` (openssl, a dependency of ca-certificates).
struct Pki {
    ca_cert: String,
    server_cert: String,
    server_key: String,
}

fn make_pki(dir: &Path) -> Pki {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", tail(&out));
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=volumes test CA",
    ]);
    for (name, extension) in [
        ("server", "subjectAltName=DNS:tls-echo.test"),
        ("client", "extendedKeyUsage=clientAuth"),
    ] {
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]);
        std::fs::write(dir.join(format!("{name}.ext")), extension).unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            &format!("{name}.crt"),
            "-extfile",
            &format!("{name}.ext"),
        ]);
    }
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    Pki {
        ca_cert: read("ca.crt"),
        server_cert: read("server.crt"),
        server_key: read("server.key"),
    }
}

/// Pods reach a Service at its cluster IP and by its name, as kube-proxy and the cluster's
/// DNS make it on a real cluster: a Job in the image loads `http://echo/` (its namespace's
/// search domain), and both of the Service's pods answer it. The API server is reached at
/// the `kubernetes` Service's address with the pod's own token and CA, as an in-cluster
/// client reaches it.
pub(crate) fn pods_reach_services_by_name_and_the_api_through_its_service(dir: &Path) {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::{DeleteParams, PostParams};
    let config = dir.join("cluster/kubeconfig");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = ingressbench_cluster::api::client(&config, None).await.unwrap();
        let ns = "services";
        let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
        namespaces
            .create(&PostParams::default(), &serde_json::from_value(serde_json::json!({ "metadata": { "name": ns } })).unwrap())
            .await
            .unwrap();
        let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(client.clone(), ns);
        wait_for("the namespace's default service account", async || {
            accounts.get_opt("default").await.unwrap()
        })
        .await;
        let objects = [
            serde_json::json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": "echo", "namespace": ns },
                "spec": { "replicas": 2, "selector": { "matchLabels": { "app": "echo" } },
                  "template": { "metadata": { "labels": { "app": "echo" } }, "spec": { "containers": [{
                    "name": "echo", "image": "example.test/ingressbench:dev",
                    "args": ["backend", "--listen", "0.0.0.0:8080", "--name", "$(POD_NAME)"],
                    "env": [{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }],
                    "ports": [{ "name": "http", "containerPort": 8080 }],
                    "readinessProbe": { "httpGet": { "path": "/healthz", "port": "http" } } }] } } } }),
            serde_json::json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "echo", "namespace": ns },
                "spec": { "type": "LoadBalancer", "selector": { "app": "echo" },
                  "ports": [{ "name": "web", "port": 80, "targetPort": "http" }] } }),
        ];
        ingressbench_cluster::api::apply_all(&config, &objects).await.unwrap();
        let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
        let ready = |p: &Pod| {
            p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
            })
        };
        let echoes: Vec<Pod> = wait_for("two ready echo pods", async || {
            let list = pods.list(&kube::api::ListParams::default().labels("app=echo")).await.unwrap().items;
            (list.len() == 2 && list.iter().all(ready)).then_some(list)
        })
        .await;
        // A client in the image, by the Service's short name.
        let job: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "client" },
            "spec": { "restartPolicy": "Never", "containers": [{
                "name": "load", "image": "example.test/ingressbench:dev",
                "args": ["load", "http://echo/", "-n", "40", "--connections", "2"] }] }
        }))
        .unwrap();
        // The Service's endpoints are read within a refresh of the agent's.
        tokio::time::sleep(2 * ingressbench_cluster::agent::SERVICES_REFRESH).await;
        pods.create(&PostParams::default(), &job).await.unwrap();
        let phase = wait_for("the client's end", async || {
            let p = pods.get("client").await.unwrap();
            p.status?.phase.filter(|p| p == "Succeeded" || p == "Failed")
        })
        .await;
        let log = std::fs::read_to_string(dir.join(format!("cluster/pods/{ns}_client.log"))).unwrap();
        assert_eq!(phase, "Succeeded", "{log}");
        assert!(log.contains("40 ok, 0 errors"), "{log}");
        // Its two connections went to the two pods, in turn.
        let backends = log.lines().find(|l| l.trim_start().starts_with("Backends:")).unwrap();
        for pod in &echoes {
            assert!(backends.contains(pod.metadata.name.as_deref().unwrap()), "{log}");
        }
        // A LoadBalancer Service gets an address of its own on the host, as kind's cloud
        // provider gives one, and it reaches the pods.
        let services: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::namespaced(client.clone(), ns);
        let lb = wait_for("the load balancer's address", async || {
            let s = services.get("echo").await.unwrap();
            s.status?.load_balancer?.ingress?.first()?.ip.clone()
        })
        .await;
        assert!(lb.starts_with("127.1."), "{lb}");
        let names: Vec<String> = echoes.iter().filter_map(|p| p.metadata.name.clone()).collect();
        let via = backend_via(&format!("{lb}:80"), "echo").unwrap_or_default();
        assert!(names.contains(&via), "{via} {names:?}");
        // The API server at the `kubernetes` Service, from an echo pod's namespace, with
        // that pod's token and the cluster's CA from its service-account volume.
        let pod = &echoes[0];
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
        let netns = namespace_with(&ip);
        let uid = pod.metadata.uid.clone().unwrap();
        let volumes = dir.join("cluster/pods/volumes").join(&uid);
        let account = std::fs::read_dir(&volumes)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("kube-api-access-"))
            .unwrap();
        let token = std::fs::read_to_string(account.join("token")).unwrap();
        let out = Command::new("ip")
            .args(["netns", "exec", &netns, "curl", "-sS", "--max-time", "5", "--cacert"])
            .arg(account.join("ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("https://10.96.0.1/api/v1/namespaces/{ns}/pods/{}", pod.metadata.name.as_deref().unwrap()))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        // The default service account may not read pods: the API server says so, by name.
        assert!(said.contains("system:serviceaccount:services:default"), "{said} {}", tail(&out));
        assert_eq!(std::fs::read_to_string(account.join("namespace")).unwrap(), ns);
        // Deleted; the parts after need not wait for it to be gone.
        namespaces.delete(ns, &DeleteParams::default()).await.unwrap();
    });
}

/// The network namespace whose `eth0` has `ip`.
fn namespace_with(ip: &str) -> String {
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .find(|ns| {
            let addr = Command::new("ip")
                .args(["-n", ns, "-4", "-o", "addr", "show"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&addr.stdout).contains(&format!("inet {ip}/"))
        })
        .unwrap_or_else(|| panic!("no network namespace has {ip}"))
        .to_owned()
}

/// Envoy Gateway, which `cluster local up` installed the way its users install it
/// (`helm install` of its own chart, release 1.9.0 here), runs on the node agent: the
/// chart's certgen Job wrote the Secrets the controller's pod waited for, the controller
/// reaches the API server through the `kubernetes` Service, and the data plane it made
/// for the Gateway (Envoy and its shutdown manager, from the staged images, with their
/// Secret and ConfigMap volumes) takes its configuration over xDS from the controller's
/// Service and serves a route at the address its LoadBalancer Service was given, which
/// the cluster file's `envoy-gateway` target names. Then a scenario's `upgrade: 1.9.1`
/// event under open-loop load is a `helm upgrade` to 1.9.1's chart: the controller rolls,
/// the new controller rolls its data plane (whose old Envoy drains through its preStop
/// hooks), and the event has its three times.
pub(crate) fn envoy_gateway_runs_from_its_chart_with_the_data_plane_it_creates(dir: &Path) {
    use ingressbench_cluster::local::ENVOY_GATEWAY_NAMESPACE;
    let config = dir.join("cluster/kubeconfig");
    let file = std::fs::read_to_string(dir.join("cluster.yaml")).unwrap();
    let target = file
        .lines()
        .find(|l| l.starts_with("  envoy-gateway: "))
        .unwrap_or_else(|| panic!("no envoy-gateway target: {file}"));
    let address = target
        .split("address: \"http://")
        .nth(1)
        .and_then(|a| a.split('"').next())
        .unwrap_or_else(|| panic!("{target}"))
        .to_owned();
    assert!(address.starts_with("127.1."), "{target}");
    for says in [
        "gateway: { name: eg, namespace: envoy-gateway-system, listener: http, tls_listener: https }",
        "restart: { deployment: envoy-gateway, namespace: envoy-gateway-system }",
        "counters: { pods: { namespace: envoy-gateway-system",
        "upgrade: { helm: { release: eg, namespace: envoy-gateway-system, chart: ",
    ] {
        assert!(target.contains(says), "{says}: {target}");
    }
    let objects = [
        serde_json::json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "eg-test" } }),
        serde_json::json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": "echo", "namespace": "eg-test" },
            "spec": { "replicas": 2, "selector": { "matchLabels": { "app": "echo" } },
              "template": { "metadata": { "labels": { "app": "echo" } }, "spec": { "containers": [{
                "name": "echo", "image": "example.test/ingressbench:dev",
                "args": ["backend", "--listen", "0.0.0.0:8080", "--name", "$(POD_NAME)"],
                "env": [{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }],
                "readinessProbe": { "httpGet": { "path": "/healthz", "port": 8080 } } }] } } } }),
        serde_json::json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "echo", "namespace": "eg-test" },
            "spec": { "selector": { "app": "echo" }, "ports": [{ "port": 80, "targetPort": 8080 }] } }),
        serde_json::json!({ "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": { "name": "echo", "namespace": "eg-test" },
            "spec": { "parentRefs": [{ "name": "eg", "namespace": ENVOY_GATEWAY_NAMESPACE }], "hostnames": ["eg-test.app.test"],
              "rules": [{ "backendRefs": [{ "name": "echo", "port": 80 }] }] } }),
    ];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        ingressbench_cluster::api::apply_all(&config, &objects)
            .await
            .unwrap();
        // Both pods answer through the Gateway's address.
        let mut seen = std::collections::BTreeSet::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while seen.len() < 2 && std::time::Instant::now() < deadline {
            if let Some(b) = backend_via(&address, "eg-test.app.test") {
                seen.insert(b);
            } else {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
    });
    // The upgrade to 1.9.1 under load, which lasts until the old Envoy has drained: its
    // new controller was ready 2 s after it was asked on a quiet machine, 13 s on a busy
    // one, and the drain is 10 s after the rollout.
    let scenario = dir.join("eg-upgrade.yaml");
    std::fs::write(
        &scenario,
        "name: eg-upgrade\ntargets: [{ cluster: envoy-gateway }]\nbackends: [{ name: echo, replicas: 2 }]\ntls: false\nload: { mode: open, rate: 200, connections: 4, duration: 40s }\nevents:\n  - { at: 3s, upgrade: 1.9.1 }\n",
    )
    .unwrap();
    let out = dir.join("eg-upgrade");
    let run = crate::cluster::run_in_cluster(&scenario, &dir.join("cluster.yaml"), &config, &out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let cell = std::fs::read_dir(out.join("cells"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let impact = crate::cluster::json_of(&cell, "impact.json");
    let upgrade = &impact[0];
    assert!(
        upgrade["what"].as_str().unwrap().starts_with(
            "upgrade to 1.9.1: helm upgrade envoy-gateway-system/eg (Deployment envoy-gateway: 1 pods, Deployment envoy-envoy-gateway-system-eg-"
        ),
        "{upgrade}"
    );
    let time = |key: &str| upgrade[key].as_f64().unwrap_or(-1.0);
    // Applied once the new controller was ready; complete once the data plane it rolled
    // was, its old Envoy drained (at least the shutdown manager's 10 s minimum).
    assert!(time("applied_s") > time("requested_s"), "{upgrade}");
    assert!(time("completed_s") >= time("applied_s") + 10.0, "{upgrade}");
    let summary = crate::cluster::json_of(&cell, "summary.json");
    eprintln!(
        "envoy gateway upgrade 1.9.0 -> 1.9.1: applied {:.2} s, complete {:.2} s after asked; {} of {} requests failed",
        time("applied_s") - time("requested_s"),
        time("completed_s") - time("requested_s"),
        summary["requests"]["errors"],
        summary["requests"]["total"]
    );
    // What ran: the controller and the certgen Job from the gateway image of each version;
    // the data plane's Envoy from the Envoy image with its volumes, beside its shutdown
    // manager.
    let ran = std::fs::read_to_string(dir.join("cluster/pods/ran.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = ran
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| {
            r["pod"]
                .as_str()
                .unwrap()
                .starts_with("envoy-gateway-system/")
        })
        .collect();
    for version in ["1.9.0", "1.9.1"] {
        for container in ["envoy-gateway", "envoy-gateway-certgen", "shutdown-manager"] {
            let r = records
                .iter()
                .find(|r| {
                    r["container"] == container
                        && r["image"]
                            .as_str()
                            .unwrap()
                            .starts_with(&format!("gateway:v{version} (staged"))
                })
                .unwrap_or_else(|| panic!("no {container} of {version} in {ran}"));
            assert_eq!(r["ran"], "image", "{r}");
        }
    }
    let envoy = records
        .iter()
        .find(|r| r["container"] == "envoy")
        .unwrap_or_else(|| panic!("no envoy in {ran}"));
    assert!(
        envoy["image"]
            .as_str()
            .unwrap()
            .starts_with("envoy (staged"),
        "{envoy}"
    );
    for at in ["\"/certs\"", "\"/sds\""] {
        assert!(envoy["mounts"].to_string().contains(at), "{at}: {envoy}");
    }
    // Gone again, so that the parts after see none of it; Envoy Gateway stays.
    runtime.block_on(async {
        let client = ingressbench_cluster::api::client(&config, None)
            .await
            .unwrap();
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        namespaces
            .delete("eg-test", &Default::default())
            .await
            .unwrap();
    });
}
