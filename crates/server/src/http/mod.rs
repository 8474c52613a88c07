//! The HTTP surface: [`app`] is the whole router (tests call it directly).
//! `rest/` is `/api/v1`, one file per resource; `ws.rs` is one viewer's
//! WebSocket; `auth.rs` turns tokens into actors; `guard.rs` checks
//! every request's Host, Origin and anonymous rate, and `proxy.rs` whom a
//! proxied one is for; `error.rs` is the one
//! error type; `shared.rs` is what every handler shares, with
//! [`Shared::submit`], the one door into the tick loop.

pub mod auth;
pub mod error;
pub mod guard;
pub mod listen;
pub mod proxy;
pub mod rate;
pub mod rest;
pub mod shared;
pub mod ws;

use std::path::Path;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::services::ServeDir;
use tower_http::trace::TraceLayer;

use shared::{MAX_BODY_BYTES, Shared};

/// The whole HTTP surface.
pub fn app(shared: Shared, web_dir: &Path) -> Router {
    let api = rest::routes(shared.0.limits.max_population);
    let mut router = Router::new()
        .route("/ws", get(ws::upgrade))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(prometheus))
        .method_not_allowed_fallback(rest::wrong_method)
        .nest("/api/v1", api);
    router = if web_dir.join("index.html").is_file() {
        router.fallback_service(ServeDir::new(web_dir))
    } else {
        let page = missing_viewer_page(web_dir);
        router.fallback(move || {
            let page = page.clone();
            async move { (StatusCode::OK, Html(page)) }
        })
    };
    router
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            guard::check,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_failure(on_failure),
        )
        .with_state(shared)
}

/// A request's span: its method and path, never its query (a `?token=`
/// would be written to the log).
fn request_span(req: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    tracing::debug_span!(
        "request",
        method = %req.method(),
        path = %req.uri().path(),
        version = ?req.version(),
    )
}

/// A failed response, logged: a 503, at DEBUG (at ERROR, a client
/// retrying on a full server wrote a line a try). Most are refusals (full,
/// busy, no snapshot yet; the viewer ones counted in `viewers_refused`);
/// the others are logged at WARN where they are made (an edge that cannot
/// forward a command, `/readyz` with no fresh state). Any other failure at
/// ERROR.
fn on_failure(class: ServerErrorsFailureClass, latency: Duration, _span: &tracing::Span) {
    match class {
        ServerErrorsFailureClass::StatusCode(StatusCode::SERVICE_UNAVAILABLE) => {
            tracing::debug!(?latency, "refused: 503");
        }
        other => tracing::error!(classification = %other, ?latency, "response failed"),
    }
}

fn missing_viewer_page(dir: &Path) -> String {
    format!(
        "<!doctype html><meta charset=utf-8><title>Starling</title>\
         <h1>Starling is running</h1>\
         <p>The web viewer is not built: no <code>index.html</code> in <code>{}</code>.</p>\
         <p>Build it with <code>cargo xtask run</code> (which also starts the server), \
         or point <code>--web-dir</code> at a built viewer.</p>\
         <p>The REST API is under <a href=\"/api/v1/state\"><code>/api/v1</code></a>; \
         metrics at <a href=\"/metrics\"><code>/metrics</code></a>.</p>",
        dir.display()
    )
}

async fn readyz(State(s): State<Shared>) -> Response {
    let st = s.state();
    if st.at.elapsed() >= Duration::from_secs(2) {
        // Logged here: the 503 is logged at DEBUG, with refusals.
        tracing::warn!(age = ?st.at.elapsed(), "not ready: no fresh state");
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no fresh state: the tick loop is not publishing, or an edge hears nothing from its origin over NATS",
        )
            .into_response()
    } else if st.broadcast.is_none() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no snapshot yet: an edge waits for the origin's keyframes",
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready").into_response()
    }
}

async fn prometheus(State(s): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.0.telemetry.render(),
    )
        .into_response()
}
