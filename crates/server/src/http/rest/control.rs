//! `/control`: pause, resume, step, reset, and seek (serving a replay).
//! Operator only.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ErrorBody;
use super::extract::{Body, Caller, OptionalBody};
use crate::command::{Actor, Op};
use crate::http::error::ApiError;
use crate::http::shared::Shared;

pub(super) fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(step))
        .routes(routes!(reset))
        .routes(routes!(seek))
}

/// After a control command.
#[derive(Debug, Serialize, ToSchema)]
struct ControlBody {
    /// The tick at whose boundary it took effect.
    tick: u64,
    /// The tick now (after a step: `tick + n`).
    now: u64,
    /// Whether the simulation is paused now.
    paused: bool,
}

/// `POST /control/step`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StepBody {
    /// Ticks to advance, 1 ..= 3600. Default 1.
    #[serde(default = "one")]
    n: u32,
}

fn one() -> u32 {
    1
}

/// `POST /control/reset`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    /// A new seed (absent: the same).
    seed: Option<u64>,
}

/// `POST /control/seek`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SeekBody {
    /// The tick to go to, within the recording (see `GET /state`, `replay`).
    tick: u64,
}

async fn control(s: Shared, actor: Actor, op: Op) -> Result<Json<ControlBody>, ApiError> {
    let a = s.submit(actor, op).await?;
    let st = s.state();
    Ok(Json(ControlBody {
        tick: a.tick,
        now: st.tick,
        paused: st.paused,
    }))
}

/// Stops ticking (operator).
#[utoipa::path(post, path = "/control/pause", tag = "control", responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn pause(State(s): State<Shared>, Caller(c): Caller) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Pause).await
}
/// Ticks again (operator).
#[utoipa::path(post, path = "/control/resume", tag = "control", responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn resume(State(s): State<Shared>, Caller(c): Caller) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Resume).await
}
/// Advances a paused simulation `n` ticks (default 1; operator).
#[utoipa::path(post, path = "/control/step", tag = "control", request_body(content = Option<StepBody>, description = "optional"),
    responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn step(
    State(s): State<Shared>,
    Caller(c): Caller,
    OptionalBody(b): OptionalBody<StepBody>,
) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Step { n: b.n }).await
}
/// Starts over with the same population and parameters (operator).
#[utoipa::path(post, path = "/control/reset", tag = "control", request_body(content = Option<ResetBody>, description = "optional"),
    responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn reset(
    State(s): State<Shared>,
    Caller(c): Caller,
    OptionalBody(b): OptionalBody<ResetBody>,
) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Reset { seed: b.seed }).await
}
/// Serving a replay: goes to a tick of the recording (operator).
#[utoipa::path(post, path = "/control/seek", tag = "control", request_body = SeekBody,
    responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn seek(
    State(s): State<Shared>,
    Caller(c): Caller,
    Body(b): Body<SeekBody>,
) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Seek { tick: b.tick }).await
}
