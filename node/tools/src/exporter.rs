//! `cuslice exporter --listen ADDR`: serves `/metrics` (the node's view in the OpenMetrics text
//! format, read at each scrape) over HTTP, one request at a time.

use std::net::{SocketAddr, ToSocketAddrs};

use tiny_http::{Header, Method, Response, Server};

use crate::collect::Sources;
use crate::metrics;

/// Parses `ADDR`: `HOST:PORT`, `[V6]:PORT`, or `:PORT` for every address.
pub fn parse_listen(addr: &str) -> Result<SocketAddr, String> {
    let full = match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_string(),
    };
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            format!(
                "--listen {addr:?} is not an address to listen on; write HOST:PORT, e.g. \
                 --listen 127.0.0.1:9400, or --listen :9400 for every address"
            )
        })
}

/// Serves until killed. Err: one line (the address could not be bound).
pub fn serve(addr: SocketAddr, sources: Sources) -> Result<(), String> {
    let exporter = Exporter::bind(addr)?;
    // Tests and scripts wait for this line to know the port (with --listen HOST:0).
    println!("{}", exporter.banner());
    exporter.serve(sources);
    Ok(())
}

/// A bound exporter, not yet serving: the agent binds it before it says it is up.
pub struct Exporter {
    server: Server,
    bound: String,
}

impl Exporter {
    /// Err: one line (the address could not be bound).
    pub fn bind(addr: SocketAddr) -> Result<Exporter, String> {
        let server = Server::http(addr)
            .map_err(|e| format!("cannot listen on {addr}: {e}; pick another --listen address"))?;
        let bound = server
            .server_addr()
            .to_ip()
            .map_or_else(|| addr.to_string(), |a| a.to_string());
        Ok(Exporter { server, bound })
    }

    /// `cuslice exporter: serving http://ADDR/metrics`, with the port bound.
    pub fn banner(&self) -> String {
        format!("cuslice exporter: serving http://{}/metrics", self.bound)
    }

    /// Answers requests, one at a time, until the process ends.
    pub fn serve(self, sources: Sources) {
        let registry = metrics::registry(sources);
        for request in self.server.incoming_requests() {
            let path = request.url().split('?').next().unwrap_or("");
            let response = match (request.method(), path) {
                (Method::Get | Method::Head, "/metrics") => {
                    Response::from_string(metrics::encode(&registry))
                        .with_header(header(metrics::CONTENT_TYPE))
                }
                (Method::Get | Method::Head, "/") => Response::from_string(
                    "cuslice exporter: GPU slices on this node; metrics at /metrics\n",
                )
                .with_header(header("text/plain; charset=utf-8")),
                (Method::Get | Method::Head, _) => {
                    Response::from_string("not found; the metrics are at /metrics\n")
                        .with_status_code(404)
                }
                _ => Response::from_string("only GET and HEAD\n").with_status_code(405),
            };
            // A client that went away is its own business.
            let _ = request.respond(response);
        }
    }
}

fn header(content_type: &str) -> Header {
    Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes())
        .expect("a content type made of ASCII is a valid header")
}
