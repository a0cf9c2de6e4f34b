//! The dashboard's HTTP server: `GET /` (the page), `/api/status?window=S` (a [`Snapshot`]
//! as JSON), `/metrics` (Prometheus text). Nothing else is served; requests are read with a
//! time limit and bodies are ignored.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::{page, Snapshot};

/// Connections served at once (more wait to be accepted).
const CONNECTIONS: usize = 32;

/// The task stream's window when the request names none, and the most it may be.
const WINDOW: f64 = 10.0;
const MAX_WINDOW: f64 = 300.0;

/// Serves the dashboard on `listener`; `snapshot(window)` asks the scheduler for its state
/// (`None`: the scheduler has stopped).
pub(crate) async fn serve<F, Fut>(listener: TcpListener, snapshot: F)
where
    F: Fn(Duration) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<Snapshot>> + Send,
{
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    loop {
        let Ok(slot) = std::sync::Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "the dashboard could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let snapshot = snapshot.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| respond(req, snapshot.clone()));
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "a dashboard connection ended");
            }
            drop(slot);
        });
    }
}

fn reply(status: StatusCode, kind: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = kind.parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

/// The window a query asks for (`window=S`), within bounds.
fn window(query: Option<&str>) -> Duration {
    let asked = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("window="))
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|w| w.is_finite())
        .unwrap_or(WINDOW);
    Duration::from_secs_f64(asked.clamp(1.0, MAX_WINDOW))
}

async fn respond<F, Fut>(
    req: Request<Incoming>,
    snapshot: F,
) -> Result<Response<Full<Bytes>>, Infallible>
where
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = Option<Snapshot>>,
{
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n",
        ));
    }
    let gone = || {
        reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the scheduler has stopped\n",
        )
    };
    Ok(match req.uri().path() {
        "/" | "/index.html" => reply(StatusCode::OK, "text/html; charset=utf-8", page::HTML),
        "/api/status" => match snapshot(window(req.uri().query())).await {
            Some(s) => match serde_json::to_vec(&s) {
                Ok(json) => reply(StatusCode::OK, "application/json", json),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("{e}\n"),
                ),
            },
            None => gone(),
        },
        "/metrics" => match snapshot(Duration::from_secs(1)).await {
            Some(s) => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                super::metrics::render(&s),
            ),
            None => gone(),
        },
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_bounded() {
        assert_eq!(window(None), Duration::from_secs(10));
        assert_eq!(window(Some("window=30")), Duration::from_secs(30));
        assert_eq!(window(Some("x=1&window=0.1")), Duration::from_secs(1));
        assert_eq!(window(Some("window=1e9")), Duration::from_secs(300));
        assert_eq!(window(Some("window=NaN")), Duration::from_secs(10));
        assert_eq!(window(Some("window=abc")), Duration::from_secs(10));
    }
}
