//! `/boids`: spawn, remove, set the population, and failure injection
//! (kill, freeze, thaw). Operator only.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use starling_sim::Vec3;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{Body, Caller, OptionalBody};
use super::{AppliedBody, ErrorBody, applied};
use crate::command::{Amount, DEFAULT_SPREAD_M, Op, Selection, exactly_one};
use crate::http::error::ApiError;
use crate::http::shared::Shared;

pub(super) fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(spawn_boids))
        .routes(routes!(remove_boids))
        .routes(routes!(set_population))
        .routes(routes!(kill_boids))
        .routes(routes!(freeze_boids))
        .routes(routes!(thaw_boids))
}

/// `POST /boids/spawn`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SpawnBody {
    /// Centre of the ball they appear in, metres.
    center: [f32; 3],
    /// How many.
    count: usize,
    /// Radius of the ball, metres. Default 5.
    spread_m: Option<f32>,
}

/// `POST /boids/remove`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RemoveBoidsBody {
    /// Ids of the boids to remove (all or nothing).
    ids: Vec<u32>,
}

/// `PUT /boids/population`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PopulationBody {
    /// The number of boids wanted.
    population: usize,
}

/// `POST /boids/kill`: exactly one of `count` and `fraction`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct KillBody {
    /// How many boids to kill.
    count: Option<usize>,
    /// Or what fraction of the boids alive when it applies, 0 ..= 1.
    fraction: Option<f64>,
}

/// `POST /boids/freeze`: exactly one of `count`, `fraction` and `ids`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct FreezeBody {
    /// How many boids to freeze, chosen at random from the seed.
    count: Option<usize>,
    /// Or what fraction of the boids alive when it applies, 0 ..= 1.
    fraction: Option<f64>,
    /// Or exactly these boids.
    ids: Option<Vec<u32>>,
}

/// `POST /boids/thaw`: the ids to thaw (none: every frozen boid).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ThawBody {
    /// Ids of frozen boids to thaw (absent: all of them).
    ids: Option<Vec<u32>>,
}

/// Spawns `count` boids in a ball around `center` (operator).
#[utoipa::path(post, path = "/boids/spawn", tag = "boids", request_body = SpawnBody,
    responses((status = 201, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn spawn_boids(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(b): Body<SpawnBody>,
) -> Result<(StatusCode, Json<AppliedBody>), ApiError> {
    let op = Op::SpawnBoids {
        center: Vec3::from(b.center),
        count: b.count,
        spread_m: b.spread_m.unwrap_or(DEFAULT_SPREAD_M),
    };
    Ok(applied(StatusCode::CREATED, s.submit(actor, op).await?))
}

/// Removes boids by id, all or nothing (operator).
#[utoipa::path(post, path = "/boids/remove", tag = "boids", request_body = RemoveBoidsBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn remove_boids(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(b): Body<RemoveBoidsBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    let a = s.submit(actor, Op::RemoveBoids { ids: b.ids }).await?;
    Ok(applied(StatusCode::OK, a).1)
}

/// Grows or shrinks the flock to exactly `population` boids (operator).
#[utoipa::path(put, path = "/boids/population", tag = "boids", request_body = PopulationBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn set_population(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(b): Body<PopulationBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    let op = Op::SetPopulation {
        population: b.population,
    };
    Ok(applied(StatusCode::OK, s.submit(actor, op).await?).1)
}

/// Failure injection: kills boids chosen at random from the run's seed (operator).
#[utoipa::path(post, path = "/boids/kill", tag = "boids", request_body = KillBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn kill_boids(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(b): Body<KillBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    let amount = match (b.count, b.fraction) {
        (Some(n), None) => Amount::Count(n),
        (None, Some(f)) => Amount::Fraction(f),
        _ => return Err(exactly_one("count", "`count` and `fraction`").into()),
    };
    Ok(applied(
        StatusCode::OK,
        s.submit(actor, Op::KillBoids(amount)).await?,
    )
    .1)
}

/// Failure injection: freezes boids (dead motors: they drift on their last
/// velocity and ignore every rule; others still see them). Operator.
#[utoipa::path(post, path = "/boids/freeze", tag = "boids", request_body = FreezeBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn freeze_boids(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(b): Body<FreezeBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    let which = match (b.count, b.fraction, b.ids) {
        (Some(n), None, None) => Selection::Count(n),
        (None, Some(f), None) => Selection::Fraction(f),
        (None, None, Some(ids)) => Selection::Ids(ids),
        _ => return Err(exactly_one("count", "`count`, `fraction` and `ids`").into()),
    };
    Ok(applied(
        StatusCode::OK,
        s.submit(actor, Op::FreezeBoids(which)).await?,
    )
    .1)
}

/// Thaws frozen boids: they follow the rules again (operator).
#[utoipa::path(post, path = "/boids/thaw", tag = "boids", request_body(content = Option<ThawBody>, description = "optional"),
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn thaw_boids(
    State(s): State<Shared>,
    Caller(actor): Caller,
    OptionalBody(b): OptionalBody<ThawBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    Ok(applied(
        StatusCode::OK,
        s.submit(actor, Op::Thaw { ids: b.ids }).await?,
    )
    .1)
}
