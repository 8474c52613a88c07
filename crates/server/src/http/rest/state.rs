//! Reading the live flock: `/state`, `/metrics`, `/trajectories.csv`.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::ErrorBody;
use super::extract::Caller;
use crate::command::{OpError, serde_field};
use crate::engine::history::HISTORY_MAX_S;
use crate::engine::published::MetricsBody;
use crate::http::error::ApiError;
use crate::http::shared::{EXPORTS_AT_ONCE, EXPORTS_PER_MINUTE, Shared};

pub(super) fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(state))
        .routes(routes!(metrics))
        .routes(routes!(trajectories))
}

/// `GET /state`.
#[derive(Debug, Serialize, ToSchema)]
struct StateBody {
    /// Ticks completed.
    tick: u64,
    /// Boids alive.
    population: usize,
    /// Frozen boids (failure injection).
    frozen: usize,
    /// Present when serving a replay: the recording's first and last tick.
    replay: Option<ReplayRange>,
    /// Whether ticking is paused.
    paused: bool,
    /// Ticks per second.
    tick_hz: u32,
    /// Time the last step took, milliseconds.
    step_ms: f32,
    /// Ticks that could not start on time since the server started.
    missed_ticks: u64,
    /// Open viewer connections.
    viewers: usize,
}

/// The ticks a served recording covers.
#[derive(Debug, Serialize, ToSchema)]
struct ReplayRange {
    /// The recording's first tick.
    start_tick: u64,
    /// Its last tick.
    end_tick: u64,
}

/// Tick, population, pause state and timing.
#[utoipa::path(get, path = "/state", tag = "state", responses((status = 200, body = StateBody)))]
async fn state(State(s): State<Shared>) -> Json<StateBody> {
    let st = s.state();
    Json(StateBody {
        tick: st.tick,
        population: st.population,
        frozen: st.frozen,
        replay: st.replay.map(|(start_tick, end_tick)| ReplayRange {
            start_tick,
            end_tick,
        }),
        paused: st.paused,
        tick_hz: st.params.tick_hz,
        step_ms: st.metrics.step_ms,
        missed_ticks: st.missed_ticks,
        viewers: s.viewers(),
    })
}

/// `GET /trajectories.csv` query (other parameters than these and
/// `token` are refused before the handler: `rest::known_query`).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct TrajectoryQuery {
    /// Seconds of history, 1 ..= 60 (default 10).
    seconds: Option<u32>,
}

/// Bytes of CSV an export hands its client at a time.
const EXPORT_CHUNK_BYTES: usize = 64 * 1024;
/// Chunks an export writes ahead of its client, at most: an export's
/// memory is bounded. A client that takes longer than the stall timeout
/// (`stall_timeout_s`) to take a chunk, or whose export is still running
/// at `export_deadline_s`, loses its export (the body ends in an error,
/// so it cannot pass for a whole CSV), and the export slot is free again.
const EXPORT_AHEAD_CHUNKS: usize = 4;

/// How an export's writer ended ([`trajectories`]).
mod export_end {
    /// Still writing, or never ran, or panicked: cut, for no known reason.
    pub(super) const UNKNOWN: u8 = 0;
    /// Written whole.
    pub(super) const WHOLE: u8 = 1;
    /// Its client took no chunk for the stall timeout.
    pub(super) const STALLED: u8 = 2;
    /// Still running at the deadline.
    pub(super) const OVERDUE: u8 = 3;
    /// Its client went away.
    pub(super) const GONE: u8 = 4;

    /// Why an export that ended so was cut short (for its log line and its
    /// body's error).
    pub(super) fn why(
        end: u8,
        stall: std::time::Duration,
        deadline: std::time::Duration,
    ) -> String {
        match end {
            STALLED => format!(
                "its client took longer than stall_timeout_s ({} s) to take a chunk",
                stall.as_secs_f32()
            ),
            OVERDUE => format!(
                "it was still running at export_deadline_s ({} s)",
                deadline.as_secs_f32()
            ),
            GONE => "its client went away".to_owned(),
            _ => "its writer stopped".to_owned(),
        }
    }
}

/// The last seconds of the live session as CSV (`tick,time_s,id,x,y,z,vx,vy,vz`),
/// sampled at 2 Hz, in id order per sample; at most 60 s and 1M rows are
/// kept. Needs the role `trajectories_role` sets (default operator); one
/// export runs at a time, each token may start 6 a minute. Written on a
/// blocking thread from shared samples, streamed as the client reads.
#[utoipa::path(get, path = "/trajectories.csv", tag = "state", params(TrajectoryQuery),
    responses((status = 200, content_type = "text/csv", body = String), (status = "4XX", body = ErrorBody),
        (status = 503, description = "another export is running", body = ErrorBody)))]
async fn trajectories(
    State(s): State<Shared>,
    Caller(actor): Caller,
    version: axum::http::Version,
    query: Result<axum::extract::Query<TrajectoryQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    if version < axum::http::Version::HTTP_11 {
        // An HTTP/1.0 body of unknown length ends when the connection
        // closes, so an export cut short would look whole.
        return Err(ApiError::invalid(
            StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            Some("version".into()),
            format!(
                "{version:?}: the export is streamed, which needs HTTP/1.1 (behind nginx: proxy_http_version 1.1)"
            ),
        ));
    }
    let axum::extract::Query(q) = query.map_err(|e| {
        let text = e.body_text();
        let field = serde_field(&text).unwrap_or("seconds").to_owned();
        ApiError::invalid(StatusCode::BAD_REQUEST, Some(field), text)
    })?;
    let seconds = q.seconds.unwrap_or(10);
    if !(1..=HISTORY_MAX_S).contains(&seconds) {
        return Err(ApiError::invalid(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("seconds".into()),
            format!("seconds = {seconds}: allowed 1 ..= {HISTORY_MAX_S}"),
        ));
    }
    let need = s.0.limits.trajectories_role;
    if actor.role < need {
        return Err(OpError::Forbidden {
            what: "exporting trajectories",
            need,
            have: actor.role,
        }
        .into());
    }
    let Some(history) = s.0.history.as_ref() else {
        return Err(ApiError::not_found(
            "this is an edge: trajectories are exported by the origin",
        ));
    };
    // The slot first: a refused export does not spend the token's allowance.
    let Ok(slot) = s.0.export_slots.clone().try_acquire_owned() else {
        return Err(ApiError::busy(format!(
            "{EXPORTS_AT_ONCE} trajectory export runs at a time; retry shortly"
        )));
    };
    if !s.0.exports.take(actor.account) {
        return Err(ApiError::rate_limited(format!(
            "a token may start {EXPORTS_PER_MINUTE} trajectory exports a minute"
        )));
    }
    let window = history.window(seconds);
    let (tx, rx) = mpsc::channel::<Bytes>(EXPORT_AHEAD_CHUNKS);
    let limits = &s.0.limits;
    let (runtime, stall, deadline) = (
        tokio::runtime::Handle::current(),
        limits.stall_timeout,
        limits.export_deadline,
    );
    let overdue_at = tokio::time::Instant::now() + deadline;
    // Set to WHOLE only when the export reached its end: otherwise (its
    // client stalled, it ran past its deadline, or the writer never ran
    // or panicked) the body ends in an error, so the client sees a broken
    // transfer, not a CSV that looks whole but is not.
    let end = Arc::new(AtomicU8::new(export_end::UNKNOWN));
    let end_by_writer = end.clone();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let whole = window.write_csv(EXPORT_CHUNK_BYTES, |chunk| {
            if tokio::time::Instant::now() >= overdue_at {
                end_by_writer.store(export_end::OVERDUE, Ordering::Release);
                return false;
            }
            let sent = runtime.block_on(async {
                let until = (tokio::time::Instant::now() + stall).min(overdue_at);
                tokio::time::timeout_at(until, tx.send(Bytes::from(chunk))).await
            });
            match sent {
                Ok(Ok(())) => true,
                Ok(Err(_)) => {
                    end_by_writer.store(export_end::GONE, Ordering::Release);
                    false
                }
                Err(_) => {
                    let overdue = tokio::time::Instant::now() >= overdue_at;
                    let why = if overdue {
                        export_end::OVERDUE
                    } else {
                        export_end::STALLED
                    };
                    end_by_writer.store(why, Ordering::Release);
                    false
                }
            }
        });
        if whole {
            end_by_writer.store(export_end::WHOLE, Ordering::Release);
        } else {
            let end = end_by_writer.load(Ordering::Acquire);
            let reason = export_end::why(end, stall, deadline);
            tracing::warn!(reason, "trajectory export cut short");
        }
    });
    let chunks =
        futures_util::stream::unfold((rx, end, false), move |(mut rx, end, ended)| async move {
            if ended {
                return None;
            }
            let why = match rx.recv().await {
                Some(chunk) => return Some((Ok(chunk), (rx, end, false))),
                // The writer is done (its sender dropped after `end` was set).
                None => match end.load(Ordering::Acquire) {
                    export_end::WHOLE => return None,
                    cut => export_end::why(cut, stall, deadline),
                },
            };
            let e = std::io::Error::other(format!("trajectory export cut short: {why}"));
            Some((Err(e), (rx, end, true)))
        });
    Ok(([(CONTENT_TYPE, "text/csv")], Body::from_stream(chunks)).into_response())
}

/// The flock's metrics: per tick, and the sampled swarm metrics.
#[utoipa::path(get, path = "/metrics", tag = "state", responses((status = 200, body = MetricsBody)))]
async fn metrics(State(s): State<Shared>) -> Json<MetricsBody> {
    Json(MetricsBody::from(&*s.state()))
}
