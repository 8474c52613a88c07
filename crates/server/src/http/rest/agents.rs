//! `/predators`, `/goals`, `/obstacles`: list, add (pilot), move and remove
//! (a pilot its own agents, an operator any).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use starling_sim::{AgentKind, Goal, Obstacle, Predator, Vec3};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{Body, Caller, PathId};
use super::{AppliedBody, ErrorBody, applied};
use crate::command::{Actor, GoalSpec, ObstacleSpec, Op, PredatorSpec, check_role};
use crate::http::error::ApiError;
use crate::http::shared::Shared;

pub(super) fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(list_predators, add_predator))
        .routes(routes!(move_predator, remove_predator))
        .routes(routes!(list_goals, add_goal))
        .routes(routes!(move_goal, remove_goal))
        .routes(routes!(list_obstacles, add_obstacle))
        .routes(routes!(move_obstacle, remove_obstacle))
}

/// `PATCH /{kind}/{id}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct MoveBody {
    /// The new position, metres.
    position: [f32; 3],
}

/// Adds a predator (pilot).
#[utoipa::path(post, path = "/predators", tag = "agents", request_body = PredatorSpec,
    responses((status = 201, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn add_predator(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(b): Body<PredatorSpec>,
) -> Result<(StatusCode, Json<AppliedBody>), ApiError> {
    let a = s.submit(actor, b.op()).await?;
    Ok(applied(StatusCode::CREATED, a))
}

/// Adds a point goal (`position`) or a waypoint path (`waypoints`) (pilot).
#[utoipa::path(post, path = "/goals", tag = "agents", request_body = GoalSpec,
    responses((status = 201, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn add_goal(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(b): Body<GoalSpec>,
) -> Result<(StatusCode, Json<AppliedBody>), ApiError> {
    let a = s.submit(actor, b.op()?).await?;
    Ok(applied(StatusCode::CREATED, a))
}

/// Adds a sphere or box obstacle (pilot).
#[utoipa::path(post, path = "/obstacles", tag = "agents", request_body = ObstacleSpec,
    responses((status = 201, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn add_obstacle(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(b): Body<ObstacleSpec>,
) -> Result<(StatusCode, Json<AppliedBody>), ApiError> {
    let a = s.submit(actor, b.op()?).await?;
    Ok(applied(StatusCode::CREATED, a))
}

/// Submits a move or removal of the agent `id`, which the route says is of
/// `kind`: the role is checked first, so an id's kind is told only to
/// those who may touch it.
async fn on_agent(
    s: Shared,
    actor: Actor,
    kind: AgentKind,
    op: Op,
) -> Result<Json<AppliedBody>, ApiError> {
    let st = s.state();
    check_role(actor, &op, &st.agents)?;
    let id = op.on_agents().target().unwrap_or(u32::MAX);
    if st.agents.kind_of(id) != Some(kind) {
        return Err(ApiError::not_found(format!(
            "no {} with id {id}",
            kind.as_str()
        )));
    }
    let a = s.submit(actor, op).await?;
    Ok(applied(StatusCode::OK, a).1)
}

fn move_op(id: u32, b: &MoveBody) -> Op {
    Op::MoveAgent {
        id,
        position: Vec3::from(b.position),
    }
}

/// Moves a predator (its pilot, or an operator).
#[utoipa::path(patch, path = "/predators/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")), request_body = MoveBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn move_predator(
    State(s): State<Shared>,
    Caller(c): Caller,
    PathId(id): PathId,
    Body(b): Body<MoveBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    on_agent(s, c, AgentKind::Predator, move_op(id, &b)).await
}
/// Moves a goal (its pilot, or an operator).
#[utoipa::path(patch, path = "/goals/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")), request_body = MoveBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn move_goal(
    State(s): State<Shared>,
    Caller(c): Caller,
    PathId(id): PathId,
    Body(b): Body<MoveBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    on_agent(s, c, AgentKind::Goal, move_op(id, &b)).await
}
/// Moves an obstacle (its pilot, or an operator).
#[utoipa::path(patch, path = "/obstacles/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")), request_body = MoveBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn move_obstacle(
    State(s): State<Shared>,
    Caller(c): Caller,
    PathId(id): PathId,
    Body(b): Body<MoveBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    on_agent(s, c, AgentKind::Obstacle, move_op(id, &b)).await
}
/// Removes a predator (its pilot, or an operator).
#[utoipa::path(delete, path = "/predators/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")),
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn remove_predator(
    State(s): State<Shared>,
    Caller(c): Caller,
    PathId(id): PathId,
) -> Result<Json<AppliedBody>, ApiError> {
    on_agent(s, c, AgentKind::Predator, Op::RemoveAgent { id }).await
}
/// Removes a goal (its pilot, or an operator).
#[utoipa::path(delete, path = "/goals/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")),
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn remove_goal(
    State(s): State<Shared>,
    Caller(c): Caller,
    PathId(id): PathId,
) -> Result<Json<AppliedBody>, ApiError> {
    on_agent(s, c, AgentKind::Goal, Op::RemoveAgent { id }).await
}
/// Removes an obstacle (its pilot, or an operator).
#[utoipa::path(delete, path = "/obstacles/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")),
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn remove_obstacle(
    State(s): State<Shared>,
    Caller(c): Caller,
    PathId(id): PathId,
) -> Result<Json<AppliedBody>, ApiError> {
    on_agent(s, c, AgentKind::Obstacle, Op::RemoveAgent { id }).await
}

/// Every predator.
#[utoipa::path(get, path = "/predators", tag = "agents", responses((status = 200, body = Vec<Predator>)))]
async fn list_predators(State(s): State<Shared>) -> Json<Vec<Predator>> {
    Json(s.state().agents.predators().to_vec())
}
/// Every goal.
#[utoipa::path(get, path = "/goals", tag = "agents", responses((status = 200, body = Vec<Goal>)))]
async fn list_goals(State(s): State<Shared>) -> Json<Vec<Goal>> {
    Json(s.state().agents.goals().to_vec())
}
/// Every obstacle.
#[utoipa::path(get, path = "/obstacles", tag = "agents", responses((status = 200, body = Vec<Obstacle>)))]
async fn list_obstacles(State(s): State<Shared>) -> Json<Vec<Obstacle>> {
    Json(s.state().agents.obstacles().to_vec())
}
