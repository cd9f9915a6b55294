//! `cuslice exporter --listen ADDR`: serves `/metrics` (the node's view in the OpenMetrics text
//! format, read at each scrape) over HTTP/1.
//!
//! Whoever can reach the port is a client, a tenant's pod included, so no client holds up
//! another: each connection is served on its own, its request head must arrive within
//! `HEAD_TIMEOUT`, it is closed after `KEEP_ALIVE` (after the response under way), and one that
//! still has not taken its response `WRITE_GRACE` later is dropped; at most `MAX_CONNECTIONS`
//! are open at once (the next waits in the kernel's backlog).

use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;

use crate::collect::Sources;
use crate::metrics;

/// A client's request head must arrive within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is closed this long after it opened, once its response under way is sent
/// (Prometheus opens another at its next scrape)...
const KEEP_ALIVE: Duration = Duration::from_secs(60);
/// ...or dropped this much later if its client still has not taken that response.
const WRITE_GRACE: Duration = Duration::from_secs(10);
/// Connections served at once.
const MAX_CONNECTIONS: usize = 256;

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
    listener: std::net::TcpListener,
    bound: SocketAddr,
}

impl Exporter {
    /// Err: one line (the address could not be bound).
    pub fn bind(addr: SocketAddr) -> Result<Exporter, String> {
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| format!("cannot listen on {addr}: {e}; pick another --listen address"))?;
        let bound = listener.local_addr().unwrap_or(addr);
        Ok(Exporter { listener, bound })
    }

    /// `cuslice exporter: serving http://ADDR/metrics`, with the port bound.
    pub fn banner(&self) -> String {
        format!("cuslice exporter: serving http://{}/metrics", self.bound)
    }

    /// Answers requests until the process ends (one line on stderr if it cannot).
    pub fn serve(self, sources: Sources) {
        let registry = Arc::new(metrics::registry(sources));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build();
        let served = runtime
            .map_err(|e| e.to_string())
            .and_then(|rt| rt.block_on(accept(self.listener, registry)));
        if let Err(e) = served {
            eprintln!(
                "cuslice exporter: stopped serving http://{}/metrics: {e}",
                self.bound
            );
        }
    }
}

/// Accepts connections, each served on a task of its own. Err: the listener failed for good.
async fn accept(listener: std::net::TcpListener, registry: Arc<Registry>) -> Result<(), String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return Err("the connection count was closed".into());
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of descriptors, or a connection reset before it was taken: try again soon.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            connection(stream, registry).await;
            drop(slot);
        });
    }
}

/// Serves one connection to its end, or to `KEEP_ALIVE` and its grace.
async fn connection(stream: tokio::net::TcpStream, registry: Arc<Registry>) {
    let service = hyper::service::service_fn(move |req| {
        let registry = registry.clone();
        async move { Ok::<_, Infallible>(answer(&req, &registry)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    // A client that went away is its own business.
    tokio::select! {
        _ = conn.as_mut() => {}
        () = tokio::time::sleep(KEEP_ALIVE) => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(WRITE_GRACE, conn).await;
        }
    }
}

/// The response to one request.
fn answer<B>(req: &Request<B>, registry: &Registry) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => (
            StatusCode::OK,
            metrics::CONTENT_TYPE,
            metrics::encode(registry),
        ),
        (&Method::GET | &Method::HEAD, "/") => (
            StatusCode::OK,
            TEXT,
            "cuslice exporter: GPU slices on this node; metrics at /metrics\n".into(),
        ),
        (&Method::GET | &Method::HEAD, _) => (
            StatusCode::NOT_FOUND,
            TEXT,
            "not found; the metrics are at /metrics\n".into(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "only GET and HEAD\n".into(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

const TEXT: &str = "text/plain; charset=utf-8";
