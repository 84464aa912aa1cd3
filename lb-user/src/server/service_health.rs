//! kube-proxy's service health server: one listener per `healthCheckNodePort` of a Service with
//! externalTrafficPolicy Local, answering with the Service's local endpoint count so that cloud load balancers
//! skip nodes without one.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
};

use tokio::task::JoinHandle;

use super::{Response, serve};
use crate::agent::ServiceHealth;

/// kube-proxy's answer on a `healthCheckNodePort`, so cloud load balancers skip nodes without endpoints.
pub fn service_health_response(s: &ServiceHealth) -> Response {
    // kube-proxy's service health server: 200 with local endpoints, else 503, and the count in a header
    // load balancers use as a weight.
    let mut r = Response::json(
        if s.local_endpoints > 0 { 200 } else { 503 },
        &serde_json::json!({
            "service": {"namespace": s.namespace, "name": s.name},
            "localEndpoints": s.local_endpoints,
            "serviceProxyHealthy": true,
        }),
    );
    r.headers.push(("X-Content-Type-Options", "nosniff".into()));
    r.headers.push(("X-Load-Balancing-Endpoint-Weight", s.local_endpoints.to_string()));
    r
}

/// One listener per `healthCheckNodePort`, opened and closed as Services come and go.
pub struct ServiceHealthServers {
    bind: IpAddr,
    listeners: BTreeMap<u16, (JoinHandle<()>, Arc<Mutex<ServiceHealth>>)>,
}

impl ServiceHealthServers {
    /// No listeners yet; they will bind on `bind`.
    pub fn new(bind: IpAddr) -> Self {
        Self { bind, listeners: BTreeMap::new() }
    }

    /// Bring the listeners in line with `want` (port -> health). Returns the ports that could not be bound.
    pub fn sync(&mut self, want: &BTreeMap<u16, ServiceHealth>) -> Vec<(u16, std::io::Error)> {
        self.listeners.retain(|port, (task, _)| {
            let keep = want.contains_key(port);
            if !keep {
                task.abort();
            }
            keep
        });
        let mut failed = Vec::new();
        for (port, h) in want {
            if let Some((_, cur)) = self.listeners.get(port) {
                *cur.lock().expect("health lock") = h.clone();
                continue;
            }
            match super::listen(SocketAddr::new(self.bind, *port)) {
                Ok(l) => {
                    let state = Arc::new(Mutex::new(h.clone()));
                    let s2 = state.clone();
                    let task = serve(l, move |_path| {
                        let s = s2.clone();
                        async move { service_health_response(&s.lock().expect("health lock")) }
                    });
                    self.listeners.insert(*port, (task, state));
                }
                Err(e) => failed.push((*port, e)),
            }
        }
        failed
    }
}

impl Drop for ServiceHealthServers {
    fn drop(&mut self) {
        for (task, _) in self.listeners.values() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_health_reports_local_endpoints() {
        let s = ServiceHealth { namespace: "ns".into(), name: "lb".into(), local_endpoints: 2 };
        let r = service_health_response(&s);
        assert_eq!(r.status, 200);
        assert!(r.headers.contains(&("X-Load-Balancing-Endpoint-Weight", "2".into())));
        let none = service_health_response(&ServiceHealth { local_endpoints: 0, ..s });
        assert_eq!(none.status, 503);
        assert!(none.body.contains("\"localEndpoints\":0"));
    }
}
