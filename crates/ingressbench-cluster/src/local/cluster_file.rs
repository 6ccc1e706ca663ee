//! The cluster file `cluster local up` writes for the cluster it started: each
//! controller as a target, where it takes traffic, how a run restarts it and reads its
//! counts and usage.

use std::net::SocketAddr;
use std::path::Path;

use super::{
    contour, envoy_gateway, haproxy_ingress, LocalCluster, CONTOUR_GATEWAY,
    CONTOUR_GATEWAY_TLS_LISTENER, ENVOY_GATEWAY, ENVOY_GATEWAY_METRICS_PORT,
    ENVOY_GATEWAY_TLS_LISTENER, GATEWAY, GATEWAY_TLS_LISTENER, OWNING_GATEWAY_LABEL,
};

impl LocalCluster {
    /// The cluster file for this cluster: the controllers it runs, each where it takes
    /// traffic (none: it runs none). Traefik and Contour are each named twice: through
    /// their IngressClass and through their Gateway (whose HTTPS listeners present a
    /// certificate from the CA the file gives as `ca:`).
    pub fn cluster_file(&self) -> Option<String> {
        // The context `cluster local up` adds to the user's kubeconfig (and its own
        // kubeconfig's): a run goes to this cluster whichever context is current.
        let mut text = String::from("context: ingressbench-local\ntargets:\n");
        // Each controller's processes, read from /proc by a run on this machine.
        let pid = |name: &str| {
            self.parts
                .iter()
                .find(|p| p.name() == name)
                .map(|p| p.pid())
        };
        // And how a `restart` event restarts its controller: this cluster's serving
        // process starts the process again.
        let restart = |controller: &str| {
            format!(
                ", restart: {{ local: \"{}\", process: {controller} }}",
                self.dir.display()
            )
        };
        let pids = |controller: &str, proxy: Option<&str>| {
            let pids = match (pid(controller), proxy.and_then(pid)) {
                (Some(c), Some(p)) => format!(", local_pids: {{ controller: {c}, proxy: {p} }}"),
                (Some(c), None) => format!(", local_pids: {{ controller: {c} }}"),
                _ => String::new(),
            };
            pids + &restart(controller)
        };
        let mut target = |name: &str, how: String, http: SocketAddr, https: SocketAddr| {
            text.push_str(&format!(
                "  {name}: {{ {how}, address: \"http://{http}\", tls_address: \"https://{https}\" }}\n"
            ));
        };
        // Traefik's entry point and Envoy Gateway's HTTPS listener also take HTTP/3 here.
        let http3 = ", http3: true";
        let gateway = |(name, namespace, listener): (&str, &str, &str), tls_listener: &str| {
            let ca = self
                .gateway_ca
                .as_deref()
                .unwrap_or(Path::new(""))
                .display();
            format!("gateway: {{ name: {name}, namespace: {namespace}, listener: {listener}, tls_listener: {tls_listener} }}, ca: \"{ca}\"")
        };
        if let Some((http, https)) = self.ingress {
            let own = pids("traefik", None);
            target(
                "traefik",
                format!("ingress_class: traefik{own}{http3}"),
                http,
                https,
            );
            if self.gateway {
                target(
                    "traefik-gateway",
                    format!("{}{own}{http3}", gateway(GATEWAY, GATEWAY_TLS_LISTENER)),
                    http,
                    https,
                );
            }
        }
        if let Some([http, https]) = self.contour {
            let (secret, namespace) = contour::MESH_CLIENT_SECRET;
            // What its Envoy counted, read through Envoy's admin socket here.
            let counters = format!(
                ", counters: {{ envoy_admin: \"{}\" }}",
                self.dir.join("envoy-admin.sock").display()
            );
            let own = pids("contour", Some("contour-envoy")) + &counters;
            let how = format!(
                "ingress_class: contour, mesh_client: {{ name: {secret}, namespace: {namespace} }}{own}"
            );
            target("contour", how, http, https);
            let how = format!(
                "{}{own}",
                gateway(CONTOUR_GATEWAY, CONTOUR_GATEWAY_TLS_LISTENER)
            );
            target("contour-gateway", how, http, https);
        }
        if let Some((http, https)) = self.haproxy_ingress {
            let class = format!(
                "ingress_class: {}{}",
                haproxy_ingress::CLASS,
                pids("haproxy-ingress", None)
                    + &format!(
                        ", counters: {{ haproxy_stat: \"{}\" }}",
                        haproxy_ingress::admin_socket(&self.dir).display()
                    )
            );
            target("haproxy-ingress", class, http, https);
        }
        if let Some(eg) = &self.envoy_gateway {
            let [http, https] = eg.at;
            let (gateway_name, namespace, _) = ENVOY_GATEWAY;
            // Its pods are the controller's: a restart rolls its Deployment, its Envoy's
            // counts and its controller's process figures are read through the API
            // server's pod proxy.
            let (client, client_namespace) = envoy_gateway::MESH_CLIENT_SECRET;
            let how = format!(
                "{}, mesh_client: {{ name: {client}, namespace: {client_namespace} }}, restart: {{ deployment: envoy-gateway, namespace: {namespace} }}, {}, \
                 counters: {{ pods: {{ namespace: {namespace}, selector: \"{OWNING_GATEWAY_LABEL}={gateway_name}\", port: {ENVOY_GATEWAY_METRICS_PORT}, exposition: envoy }} }}, \
                 usage: {{ controller: {{ namespace: {namespace}, selector: control-plane=envoy-gateway, metrics: {{ port: {ENVOY_GATEWAY_METRICS_PORT}, path: /metrics }} }} }}{http3}",
                gateway(ENVOY_GATEWAY, ENVOY_GATEWAY_TLS_LISTENER),
                eg.upgrade_via()
            );
            target("envoy-gateway", how, http, https);
        }
        // Each controller is also reached through its LoadBalancer Service, whose address
        // is an L4 front (a cloud load balancer's stand-in): a target with `service:`.
        for (name, namespace, _, _) in self.load_balancers() {
            text.push_str(&format!(
                "# through a load balancer: service: {{ name: {name}, namespace: {namespace} }}\n"
            ));
        }
        // The controllers listen on the host's loopback: load pods reach them from the
        // nodes' network.
        text.push_str("workers: { host_network: true }\n");
        (self.ingress.is_some()
            || self.contour.is_some()
            || self.haproxy_ingress.is_some()
            || self.envoy_gateway.is_some())
        .then_some(text)
    }
}
