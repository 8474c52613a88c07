//! The REST API under `/api/v1`: parameters, agents, boids, control, state
//! and metrics. Every change goes through the tick loop's queue and is
//! answered with the tick it took effect; every refusal is a JSON
//! `{error, field, detail}` with a 4xx status.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use starling_protocol::Role;
use starling_sim::{AgentKind, GoalKind, ParamsPatch, PredatorMode, Preset, Shape, Vec3};

use crate::api_error::{ApiError, unknown_field};
use crate::auth::bearer;
use crate::ops::{Applied, Op};
use crate::shared::Shared;

/// The routes, to be nested under `/api/v1`, with the OpenAPI document
/// their annotations generate (served at `/api/v1/openapi.json`).
pub fn routes() -> (Router<Shared>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(get_params, patch_params))
        .routes(routes!(list_presets))
        .routes(routes!(apply_preset))
        .routes(routes!(list_predators, add_predator))
        .routes(routes!(move_predator, remove_predator))
        .routes(routes!(list_goals, add_goal))
        .routes(routes!(move_goal, remove_goal))
        .routes(routes!(list_obstacles, add_obstacle))
        .routes(routes!(move_obstacle, remove_obstacle))
        .routes(routes!(spawn_boids))
        .routes(routes!(remove_boids))
        .routes(routes!(set_population))
        .routes(routes!(kill_boids))
        .routes(routes!(freeze_boids))
        .routes(routes!(thaw_boids))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(step))
        .routes(routes!(reset))
        .routes(routes!(seek))
        .routes(routes!(state))
        .routes(routes!(metrics))
        .routes(routes!(trajectories))
        .split_for_parts()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Starling",
        description = "Control a live flock: parameters, agents, boids, pause/step/reset. \
            Send `Authorization: Bearer <token>`; roles are viewer < pilot < operator. \
            Errors are `{error, field, detail}` with a 4xx status.",
    ),
    servers((url = "/api/v1")),
    components(schemas(ErrorBody))
)]
struct ApiDoc;

/// Who is calling: the role their token grants, and a key for their
/// rate bucket and agent cap.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Granted role.
    pub role: Role,
    /// The token (or `anonymous`).
    pub key: String,
}

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &Shared) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let token = bearer(header);
        Ok(Caller {
            role: s.0.tokens.role_of(token),
            key: token.unwrap_or("anonymous").to_owned(),
        })
    }
}

impl Caller {
    fn require(&self, need: Role, what: &str) -> Result<(), ApiError> {
        if self.role >= need {
            Ok(())
        } else {
            Err(ApiError::forbidden(self.role, need, what))
        }
    }
}

/// A JSON body whose rejections are [`ApiError`]s naming the field; an
/// empty body reads as `T::default()` when `T` has one.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<Shared> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &Shared) -> Result<Self, ApiError> {
        let h = req.headers();
        let length = h.get(axum::http::header::CONTENT_LENGTH);
        let empty = length.is_some_and(|v| v == "0")
            || (length.is_none()
                && h.get(axum::http::header::CONTENT_TYPE).is_none()
                && h.get(axum::http::header::TRANSFER_ENCODING).is_none());
        if empty {
            return Ok(Body(T::default()));
        }
        match Json::<T>::from_request(req, s).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(rej) => Err(json_error(rej)),
        }
    }
}

/// Turns axum's JSON rejection into `{error, field, detail}`; the field is
/// the path serde reports (`w_sep`, `position[1]`) or an unknown field's name.
fn json_error(rej: JsonRejection) -> ApiError {
    let status = match rej.status() {
        StatusCode::PAYLOAD_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        StatusCode::UNPROCESSABLE_ENTITY => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::BAD_REQUEST,
    };
    let text = rej.body_text();
    let detail = text
        .strip_prefix("Failed to deserialize the JSON body into the target type: ")
        .unwrap_or(&text)
        .to_owned();
    let field = match unknown_field(&detail) {
        Some(f) => Some(f.to_owned()),
        None => detail
            .split_once(": ")
            .map(|(path, _)| path.to_owned())
            .filter(|p| !p.contains(' ')),
    };
    ApiError {
        status,
        error: if status == StatusCode::PAYLOAD_TOO_LARGE {
            "too_large"
        } else {
            "invalid"
        },
        field,
        detail,
    }
}

/// A change that took effect: the tick at whose boundary it did, and the
/// id of what it created.
#[derive(Debug, Serialize, ToSchema)]
pub struct AppliedBody {
    /// The tick at whose boundary the change took effect.
    pub tick: u64,
    /// The new agent's id (creations only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
}

fn applied(status: StatusCode, a: Applied) -> (StatusCode, Json<AppliedBody>) {
    (
        status,
        Json(AppliedBody {
            tick: a.tick,
            id: a.created_id,
        }),
    )
}

/// Parameters after a change.
#[derive(Debug, Serialize, ToSchema)]
pub struct ParamsChanged {
    /// The tick at whose boundary they changed.
    pub tick: u64,
    /// All parameters now.
    pub params: starling_sim::Params,
}

/// A preset's weights.
#[derive(Debug, Serialize, ToSchema)]
pub struct PresetInfo {
    /// Name, for `POST /params/presets/{name}`.
    pub name: &'static str,
    /// Separation weight.
    pub w_sep: f32,
    /// Alignment weight.
    pub w_ali: f32,
    /// Cohesion weight.
    pub w_coh: f32,
}

/// After a control command.
#[derive(Debug, Serialize, ToSchema)]
pub struct ControlBody {
    /// The tick at whose boundary it took effect.
    pub tick: u64,
    /// The tick now (after a step: `tick + n`).
    pub now: u64,
    /// Whether the simulation is paused now.
    pub paused: bool,
}

/// Every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Class: `invalid`, `forbidden`, `not_found`, `limit_reached`, `rate_limited`, `busy`, `conflict`, `too_large`.
    pub error: String,
    /// The field at fault, when one is.
    pub field: Option<String>,
    /// What was wrong and what is allowed.
    pub detail: String,
}

// ---- parameters ----------------------------------------------------------

/// Every simulation parameter.
#[utoipa::path(get, path = "/params", tag = "params", responses((status = 200, body = starling_sim::Params)))]
async fn get_params(State(s): State<Shared>) -> Json<starling_sim::Params> {
    Json(s.state().params)
}

/// Changes any parameters, all or nothing (operator).
#[utoipa::path(patch, path = "/params", tag = "params", request_body = ParamsPatch,
    responses((status = 200, body = ParamsChanged), (status = "4XX", body = ErrorBody)))]
async fn patch_params(
    State(s): State<Shared>,
    caller: Caller,
    Body(patch): Body<ParamsPatch>,
) -> Result<Json<ParamsChanged>, ApiError> {
    caller.require(Role::Operator, "changing parameters")?;
    let a = s.submit(Op::PatchParams(Box::new(patch))).await?;
    Ok(Json(ParamsChanged {
        tick: a.tick,
        params: s.state().params,
    }))
}

/// The presets and their weights.
#[utoipa::path(get, path = "/params/presets", tag = "params", responses((status = 200, body = Vec<PresetInfo>)))]
async fn list_presets() -> Json<Vec<PresetInfo>> {
    Json(
        Preset::ALL
            .iter()
            .map(|p| {
                let (w_sep, w_ali, w_coh) = p.weights();
                PresetInfo {
                    name: p.as_str(),
                    w_sep,
                    w_ali,
                    w_coh,
                }
            })
            .collect(),
    )
}

/// Applies a preset's weights (operator).
#[utoipa::path(post, path = "/params/presets/{name}", tag = "params",
    params(("name" = String, Path, description = "balanced | starlings-scattering | arrow-formations | fish-ball")),
    responses((status = 200, body = ParamsChanged), (status = "4XX", body = ErrorBody)))]
async fn apply_preset(
    State(s): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<ParamsChanged>, ApiError> {
    caller.require(Role::Operator, "applying a preset")?;
    let preset: Preset = name.parse().map_err(|_| {
        ApiError::not_found(format!("no preset {name:?}: allowed {}", Preset::ALLOWED))
    })?;
    let a = s.submit(Op::Preset(preset)).await?;
    Ok(Json(ParamsChanged {
        tick: a.tick,
        params: s.state().params,
    }))
}

// ---- agents --------------------------------------------------------------

/// `POST /predators`.
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct PredatorBody {
    mode: Option<PredatorMode>,
    #[schema(value_type = Option<[f32; 3]>)]
    position: Option<Vec3>,
    max_speed_mps: Option<f32>,
    ttl_s: Option<f32>,
}

/// `POST /goals`: `at` for a point goal, or `waypoints` (and `looping`).
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct GoalBody {
    #[schema(value_type = Option<[f32; 3]>)]
    at: Option<Vec3>,
    #[schema(value_type = Option<Vec<[f32; 3]>>)]
    waypoints: Option<Vec<Vec3>>,
    looping: Option<bool>,
    arrive_radius_m: Option<f32>,
    ttl_s: Option<f32>,
}

/// Default goal arrive radius, metres.
const ARRIVE_RADIUS_M: f32 = 8.0;

/// `POST /obstacles`: exactly one of `sphere` and `box`.
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct ObstacleBody {
    sphere: Option<SphereBody>,
    #[serde(rename = "box")]
    aabb: Option<BoxBody>,
    ttl_s: Option<f32>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SphereBody {
    #[schema(value_type = [f32; 3])]
    center: Vec3,
    radius_m: f32,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BoxBody {
    #[schema(value_type = [f32; 3])]
    min: Vec3,
    #[schema(value_type = [f32; 3])]
    max: Vec3,
}

/// `PATCH /{kind}/{id}`.
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct MoveBody {
    #[schema(value_type = Option<[f32; 3]>)]
    position: Option<Vec3>,
}

fn required<T>(v: Option<T>, field: &str, what: &str) -> Result<T, ApiError> {
    v.ok_or_else(|| {
        ApiError::invalid(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(field.to_owned()),
            format!("missing `{field}`: {what}"),
        )
    })
}

async fn create_agent(
    s: &Shared,
    caller: &Caller,
    op: Op,
    what: &str,
) -> Result<Applied, ApiError> {
    caller.require(Role::Pilot, what)?;
    s.check_rate(caller.role, &caller.key)?;
    let slot = s.reserve_pilot_slot(caller.role, &caller.key)?;
    let a = s.submit(op).await?;
    slot.created(a.created_id);
    Ok(a)
}

/// Adds a predator (pilot).
#[utoipa::path(post, path = "/predators", tag = "agents", request_body = PredatorBody,
    responses((status = 201, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn add_predator(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<PredatorBody>,
) -> Result<(StatusCode, Json<AppliedBody>), ApiError> {
    let op = Op::AddPredator {
        mode: b.mode.unwrap_or(PredatorMode::Static),
        position: required(b.position, "position", "[x, y, z] in metres")?,
        max_speed_mps: b.max_speed_mps,
        ttl_s: b.ttl_s,
    };
    let a = create_agent(&s, &caller, op, "adding a predator").await?;
    Ok(applied(StatusCode::CREATED, a))
}

/// Adds a point goal (`at`) or a waypoint path (`waypoints`) (pilot).
#[utoipa::path(post, path = "/goals", tag = "agents", request_body = GoalBody,
    responses((status = 201, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn add_goal(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<GoalBody>,
) -> Result<(StatusCode, Json<AppliedBody>), ApiError> {
    let kind = match (b.at, b.waypoints) {
        (Some(at), None) => GoalKind::Point { at },
        (None, Some(waypoints)) => GoalKind::Path {
            waypoints,
            looping: b.looping.unwrap_or(false),
        },
        _ => {
            return Err(ApiError::invalid(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("at".into()),
                "give exactly one of `at` (a point goal) and `waypoints` (a path)",
            ));
        }
    };
    let op = Op::AddGoal {
        kind,
        arrive_radius_m: b.arrive_radius_m.unwrap_or(ARRIVE_RADIUS_M),
        ttl_s: b.ttl_s,
    };
    let a = create_agent(&s, &caller, op, "adding a goal").await?;
    Ok(applied(StatusCode::CREATED, a))
}

/// Adds a sphere or box obstacle (pilot).
#[utoipa::path(post, path = "/obstacles", tag = "agents", request_body = ObstacleBody,
    responses((status = 201, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn add_obstacle(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<ObstacleBody>,
) -> Result<(StatusCode, Json<AppliedBody>), ApiError> {
    let shape = match (b.sphere, b.aabb) {
        (Some(sp), None) => Shape::Sphere {
            center: sp.center,
            radius_m: sp.radius_m,
        },
        (None, Some(bx)) => Shape::Box {
            min: bx.min,
            max: bx.max,
        },
        _ => {
            return Err(ApiError::invalid(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("sphere".into()),
                "give exactly one of `sphere` {center, radius_m} and `box` {min, max}",
            ));
        }
    };
    let op = Op::AddObstacle {
        shape,
        ttl_s: b.ttl_s,
    };
    let a = create_agent(&s, &caller, op, "adding an obstacle").await?;
    Ok(applied(StatusCode::CREATED, a))
}

fn check_kind(s: &Shared, id: u32, kind: AgentKind) -> Result<(), ApiError> {
    if s.state().agents.kind_of(id) == Some(kind) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "no {} with id {id}",
            kind.as_str()
        )))
    }
}

async fn move_agent(
    s: Shared,
    caller: Caller,
    id: u32,
    kind: AgentKind,
    b: MoveBody,
) -> Result<Json<AppliedBody>, ApiError> {
    caller.require(Role::Pilot, "moving an agent")?;
    s.check_rate(caller.role, &caller.key)?;
    let to = required(b.position, "position", "[x, y, z] in metres")?;
    check_kind(&s, id, kind)?;
    let a = s.submit(Op::MoveAgent { id, to }).await?;
    Ok(applied(StatusCode::OK, a).1)
}

async fn remove_agent(
    s: Shared,
    caller: Caller,
    id: u32,
    kind: AgentKind,
) -> Result<Json<AppliedBody>, ApiError> {
    caller.require(Role::Pilot, "removing an agent")?;
    s.check_rate(caller.role, &caller.key)?;
    check_kind(&s, id, kind)?;
    let a = s.submit(Op::RemoveAgent { id }).await?;
    Ok(applied(StatusCode::OK, a).1)
}

/// Moves a predator (pilot).
#[utoipa::path(patch, path = "/predators/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")), request_body = MoveBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn move_predator(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
    Body(b): Body<MoveBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    move_agent(s, c, id, AgentKind::Predator, b).await
}
/// Moves a goal (pilot).
#[utoipa::path(patch, path = "/goals/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")), request_body = MoveBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn move_goal(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
    Body(b): Body<MoveBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    move_agent(s, c, id, AgentKind::Goal, b).await
}
/// Moves a obstacle (pilot).
#[utoipa::path(patch, path = "/obstacles/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")), request_body = MoveBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn move_obstacle(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
    Body(b): Body<MoveBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    move_agent(s, c, id, AgentKind::Obstacle, b).await
}
/// Removes a predator (pilot).
#[utoipa::path(delete, path = "/predators/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")),
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn remove_predator(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
) -> Result<Json<AppliedBody>, ApiError> {
    remove_agent(s, c, id, AgentKind::Predator).await
}
/// Removes a goal (pilot).
#[utoipa::path(delete, path = "/goals/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")),
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn remove_goal(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
) -> Result<Json<AppliedBody>, ApiError> {
    remove_agent(s, c, id, AgentKind::Goal).await
}
/// Removes a obstacle (pilot).
#[utoipa::path(delete, path = "/obstacles/{id}", tag = "agents", params(("id" = u32, Path, description = "agent id")),
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn remove_obstacle(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
) -> Result<Json<AppliedBody>, ApiError> {
    remove_agent(s, c, id, AgentKind::Obstacle).await
}

/// Every predator.
#[utoipa::path(get, path = "/predators", tag = "agents", responses((status = 200, body = Vec<starling_sim::Predator>)))]
async fn list_predators(State(s): State<Shared>) -> Json<Vec<starling_sim::Predator>> {
    Json(s.state().agents.predators().to_vec())
}
/// Every goal.
#[utoipa::path(get, path = "/goals", tag = "agents", responses((status = 200, body = Vec<starling_sim::Goal>)))]
async fn list_goals(State(s): State<Shared>) -> Json<Vec<starling_sim::Goal>> {
    Json(s.state().agents.goals().to_vec())
}
/// Every obstacle.
#[utoipa::path(get, path = "/obstacles", tag = "agents", responses((status = 200, body = Vec<starling_sim::Obstacle>)))]
async fn list_obstacles(State(s): State<Shared>) -> Json<Vec<starling_sim::Obstacle>> {
    Json(s.state().agents.obstacles().to_vec())
}

// ---- boids -----------------------------------------------------------------

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct SpawnBody {
    #[schema(value_type = Option<[f32; 3]>)]
    center: Option<Vec3>,
    count: Option<usize>,
    spread_m: Option<f32>,
}

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct RemoveBoidsBody {
    ids: Vec<u32>,
}

/// `POST /boids/kill`: exactly one of `count` and `fraction`.
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct KillBody {
    /// How many boids to kill.
    count: Option<usize>,
    /// Or what fraction of the boids alive, 0 ..= 1.
    fraction: Option<f64>,
}

/// Failure injection: kills boids chosen at random from the run's seed (operator).
#[utoipa::path(post, path = "/boids/kill", tag = "boids", request_body = KillBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn kill_boids(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<KillBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    caller.require(Role::Operator, "killing boids")?;
    let count = match (b.count, b.fraction) {
        (Some(n), None) => n,
        (None, Some(f)) if f.is_finite() && (0.0..=1.0).contains(&f) => {
            (f * s.state().population as f64).round() as usize
        }
        (None, Some(f)) => {
            return Err(ApiError::invalid(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("fraction".into()),
                format!("fraction = {f}: allowed 0 ..= 1"),
            ));
        }
        _ => {
            return Err(ApiError::invalid(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("count".into()),
                "give exactly one of `count` and `fraction`",
            ));
        }
    };
    Ok(applied(StatusCode::OK, s.submit(Op::KillBoids { count }).await?).1)
}

/// `POST /boids/freeze`: exactly one of `count`, `fraction` and `ids`.
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct FreezeBody {
    /// How many boids to freeze, chosen at random from the seed.
    count: Option<usize>,
    /// Or what fraction of the boids alive, 0 ..= 1.
    fraction: Option<f64>,
    /// Or exactly these boids.
    ids: Option<Vec<u32>>,
}

/// Failure injection: freezes boids (dead motors: they drift on their last
/// velocity and ignore every rule; others still see them). Operator.
#[utoipa::path(post, path = "/boids/freeze", tag = "boids", request_body = FreezeBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn freeze_boids(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<FreezeBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    caller.require(Role::Operator, "freezing boids")?;
    let op = match (b.count, b.fraction, b.ids) {
        (Some(count), None, None) => Op::FreezeBoids { count },
        (None, Some(f), None) if f.is_finite() && (0.0..=1.0).contains(&f) => Op::FreezeBoids {
            count: (f * s.state().population as f64).round() as usize,
        },
        (None, Some(f), None) => {
            return Err(ApiError::invalid(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("fraction".into()),
                format!("fraction = {f}: allowed 0 ..= 1"),
            ));
        }
        (None, None, Some(ids)) if ids.len() <= starling_sim::MAX_POPULATION => {
            Op::FreezeIds { ids }
        }
        (None, None, Some(ids)) => {
            return Err(ApiError::invalid(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("ids".into()),
                format!(
                    "{} ids: allowed at most {}",
                    ids.len(),
                    starling_sim::MAX_POPULATION
                ),
            ));
        }
        _ => {
            return Err(ApiError::invalid(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("count".into()),
                "give exactly one of `count`, `fraction` and `ids`",
            ));
        }
    };
    Ok(applied(StatusCode::OK, s.submit(op).await?).1)
}

/// `POST /boids/thaw`: the ids to thaw (none: every frozen boid).
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct ThawBody {
    /// Ids of frozen boids to thaw (absent: all of them).
    ids: Option<Vec<u32>>,
}

/// Thaws frozen boids: they follow the rules again (operator).
#[utoipa::path(post, path = "/boids/thaw", tag = "boids", request_body(content = ThawBody, description = "optional"),
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn thaw_boids(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<ThawBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    caller.require(Role::Operator, "thawing boids")?;
    Ok(applied(StatusCode::OK, s.submit(Op::Thaw { ids: b.ids }).await?).1)
}

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct PopulationBody {
    population: Option<usize>,
}

/// Spawns `count` boids in a ball around `center` (operator).
#[utoipa::path(post, path = "/boids/spawn", tag = "boids", request_body = SpawnBody,
    responses((status = 201, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn spawn_boids(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<SpawnBody>,
) -> Result<(StatusCode, Json<AppliedBody>), ApiError> {
    caller.require(Role::Operator, "spawning boids")?;
    let op = Op::SpawnBoids {
        center: required(b.center, "center", "[x, y, z] in metres")?,
        count: required(b.count, "count", "how many boids")?,
        spread_m: b.spread_m.unwrap_or(5.0),
    };
    Ok(applied(StatusCode::CREATED, s.submit(op).await?))
}

/// Removes boids by id, all or nothing (operator).
#[utoipa::path(post, path = "/boids/remove", tag = "boids", request_body = RemoveBoidsBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn remove_boids(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<RemoveBoidsBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    caller.require(Role::Operator, "removing boids")?;
    Ok(applied(
        StatusCode::OK,
        s.submit(Op::RemoveBoids { ids: b.ids }).await?,
    )
    .1)
}

/// Grows or shrinks the flock to exactly `population` boids (operator).
#[utoipa::path(put, path = "/boids/population", tag = "boids", request_body = PopulationBody,
    responses((status = 200, body = AppliedBody), (status = "4XX", body = ErrorBody)))]
async fn set_population(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<PopulationBody>,
) -> Result<Json<AppliedBody>, ApiError> {
    caller.require(Role::Operator, "setting the population")?;
    let population = required(b.population, "population", "the number of boids wanted")?;
    Ok(applied(
        StatusCode::OK,
        s.submit(Op::SetPopulation { population }).await?,
    )
    .1)
}

// ---- control ---------------------------------------------------------------

/// `POST /control/seek`.
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct SeekBody {
    /// The tick to go to, within the recording (see `GET /state`, `replay`).
    tick: Option<u64>,
}

/// Serving a replay: goes to a tick of the recording (operator).
#[utoipa::path(post, path = "/control/seek", tag = "control", request_body = SeekBody,
    responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn seek(
    State(s): State<Shared>,
    c: Caller,
    Body(b): Body<SeekBody>,
) -> Result<Json<ControlBody>, ApiError> {
    let Some(tick) = b.tick else {
        return Err(ApiError::invalid(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("tick".into()),
            "tick is required: the tick of the recording to go to",
        ));
    };
    control(s, c, Op::Seek { tick }).await
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StepBody {
    n: u32,
}

impl Default for StepBody {
    fn default() -> Self {
        Self { n: 1 }
    }
}

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    seed: Option<u64>,
}

async fn control(s: Shared, caller: Caller, op: Op) -> Result<Json<ControlBody>, ApiError> {
    caller.require(Role::Operator, op.kind())?;
    let a = s.submit(op).await?;
    let st = s.state();
    Ok(Json(ControlBody {
        tick: a.tick,
        now: st.tick,
        paused: st.paused,
    }))
}

/// Stops ticking (operator).
#[utoipa::path(post, path = "/control/pause", tag = "control", responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn pause(State(s): State<Shared>, c: Caller) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Pause).await
}
/// Ticks again (operator).
#[utoipa::path(post, path = "/control/resume", tag = "control", responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn resume(State(s): State<Shared>, c: Caller) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Resume).await
}
/// Advances a paused simulation `n` ticks (default 1; operator).
#[utoipa::path(post, path = "/control/step", tag = "control", request_body(content = StepBody, description = "optional"),
    responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn step(
    State(s): State<Shared>,
    c: Caller,
    Body(b): Body<StepBody>,
) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Step { n: b.n }).await
}
/// Starts over with the same population and parameters (operator).
#[utoipa::path(post, path = "/control/reset", tag = "control", request_body(content = ResetBody, description = "optional"),
    responses((status = 200, body = ControlBody), (status = "4XX", body = ErrorBody)))]
async fn reset(
    State(s): State<Shared>,
    c: Caller,
    Body(b): Body<ResetBody>,
) -> Result<Json<ControlBody>, ApiError> {
    control(s, c, Op::Reset { seed: b.seed }).await
}

// ---- state and metrics -----------------------------------------------------

/// `GET /state`.
#[derive(Debug, Serialize, ToSchema)]
struct StateBody {
    tick: u64,
    population: usize,
    /// Frozen boids (failure injection).
    frozen: usize,
    /// Present when serving a replay: the recording's first and last tick.
    replay: Option<ReplayRange>,
    paused: bool,
    tick_hz: u32,
    step_ms: f32,
    missed_ticks: u64,
    viewers: usize,
}

/// The ticks a served recording covers.
#[derive(Debug, Serialize, ToSchema)]
struct ReplayRange {
    start_tick: u64,
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
        viewers: s.0.viewers.load(std::sync::atomic::Ordering::Relaxed),
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
    query: Result<axum::extract::Query<TrajectoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<([(axum::http::header::HeaderName, &'static str); 1], String), ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| {
        let text = e.body_text();
        let field = unknown_field(&text).unwrap_or("seconds").to_owned();
        ApiError::invalid(StatusCode::BAD_REQUEST, Some(field), text)
    })?;
    let seconds = q.seconds.unwrap_or(10);
    if !(1..=crate::history::HISTORY_MAX_S).contains(&seconds) {
        return Err(ApiError::invalid(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("seconds".into()),
            format!(
                "seconds = {seconds}: allowed 1 ..= {}",
                crate::history::HISTORY_MAX_S
            ),
        ));
    }
    Ok((
        [(axum::http::header::CONTENT_TYPE, "text/csv")],
        s.0.history.csv(seconds),
    ))
}

/// `GET /metrics`.
#[derive(Debug, Serialize, ToSchema)]
struct MetricsBody {
    /// The last tick's metrics (every tick).
    tick: starling_sim::TickMetrics,
    /// Swarm metrics: collisions, clusters, clearance, goal distance,
    /// velocity correlation (sampled every 15 ticks).
    swarm: starling_sim::SwarmMetrics,
}

/// The flock's metrics: per tick, and the sampled swarm metrics.
#[utoipa::path(get, path = "/metrics", tag = "state", responses((status = 200, body = MetricsBody)))]
async fn metrics(State(s): State<Shared>) -> Json<MetricsBody> {
    let st = s.state();
    Json(MetricsBody {
        tick: st.metrics,
        swarm: st.swarm,
    })
}
