//! Reading the live flock: `/state`, `/metrics`, `/trajectories.csv`.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::http::header::{CONTENT_TYPE, HeaderName};
use serde::{Deserialize, Serialize};
use starling_sim::{SwarmMetrics, TickMetrics};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ErrorBody;
use crate::command::serde_field;
use crate::engine::history::HISTORY_MAX_S;
use crate::engine::published::Published;
use crate::http::error::ApiError;
use crate::http::shared::Shared;

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

/// `GET /trajectories.csv` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
struct TrajectoryQuery {
    /// Seconds of history, 1 ..= 60 (default 10).
    seconds: Option<u32>,
}

/// The last seconds of the live session as CSV (`tick,time_s,id,x,y,z,vx,vy,vz`),
/// sampled at 2 Hz, in id order per sample; at most 60 s and 1M rows are kept.
#[utoipa::path(get, path = "/trajectories.csv", tag = "state", params(TrajectoryQuery),
    responses((status = 200, content_type = "text/csv", body = String), (status = "4XX", body = ErrorBody)))]
async fn trajectories(
    State(s): State<Shared>,
    query: Result<axum::extract::Query<TrajectoryQuery>, QueryRejection>,
) -> Result<([(HeaderName, &'static str); 1], String), ApiError> {
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
    Ok(([(CONTENT_TYPE, "text/csv")], s.0.history.csv(seconds)))
}

/// `GET /metrics`.
#[derive(Debug, Serialize, ToSchema)]
struct MetricsBody {
    /// The last tick's metrics (every tick).
    tick: TickMetrics,
    /// Swarm metrics: collisions, clusters, clearance, goal distance,
    /// velocity correlation (sampled every 15 ticks).
    swarm: SwarmMetrics,
}

/// The flock's metrics: per tick, and the sampled swarm metrics.
#[utoipa::path(get, path = "/metrics", tag = "state", responses((status = 200, body = MetricsBody)))]
async fn metrics(State(s): State<Shared>) -> Json<MetricsBody> {
    Json(MetricsBody::from(&*s.state()))
}

impl From<&Published> for MetricsBody {
    fn from(st: &Published) -> Self {
        Self {
            tick: st.metrics,
            swarm: st.swarm,
        }
    }
}
