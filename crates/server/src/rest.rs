//! The REST API under `/api/v1`: parameters, agents, boids, control, state
//! and metrics. Every change goes through the tick loop's queue and is
//! answered with the tick it took effect; every refusal is a JSON
//! `{error, field, detail}` with a 4xx status.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::{get, patch, post, put};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use starling_protocol::Role;
use starling_sim::{AgentKind, GoalKind, ParamsPatch, PredatorMode, Preset, Shape, Vec3};

use crate::api_error::ApiError;
use crate::auth::bearer;
use crate::ops::{Applied, Op};
use crate::shared::Shared;

/// The routes, to be nested under `/api/v1`.
pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/params", get(get_params).patch(patch_params))
        .route("/params/presets", get(list_presets))
        .route("/params/presets/{name}", post(apply_preset))
        .route("/predators", get(list_predators).post(add_predator))
        .route(
            "/predators/{id}",
            patch(move_predator).delete(remove_predator),
        )
        .route("/goals", get(list_goals).post(add_goal))
        .route("/goals/{id}", patch(move_goal).delete(remove_goal))
        .route("/obstacles", get(list_obstacles).post(add_obstacle))
        .route(
            "/obstacles/{id}",
            patch(move_obstacle).delete(remove_obstacle),
        )
        .route("/boids/spawn", post(spawn_boids))
        .route("/boids/remove", post(remove_boids))
        .route("/boids/population", put(set_population))
        .route("/control/pause", post(pause))
        .route("/control/resume", post(resume))
        .route("/control/step", post(step))
        .route("/control/reset", post(reset))
        .route("/state", get(state))
        .route("/metrics", get(metrics))
}

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
    let field = if let Some(rest) = detail.split("unknown field `").nth(1) {
        rest.split('`').next().map(str::to_owned)
    } else {
        detail
            .split_once(": ")
            .map(|(path, _)| path.to_owned())
            .filter(|p| !p.contains(' '))
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

fn applied(status: StatusCode, a: Applied) -> (StatusCode, Json<Value>) {
    let mut body = json!({ "tick": a.tick });
    if let Some(id) = a.created_id {
        body["id"] = id.into();
    }
    (status, Json(body))
}

// ---- parameters ----------------------------------------------------------

async fn get_params(State(s): State<Shared>) -> Json<starling_sim::Params> {
    Json(s.state().params)
}

async fn patch_params(
    State(s): State<Shared>,
    caller: Caller,
    Body(patch): Body<ParamsPatch>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator, "changing parameters")?;
    let a = s.submit(Op::PatchParams(Box::new(patch))).await?;
    Ok(Json(json!({ "tick": a.tick, "params": s.state().params })))
}

async fn list_presets() -> Json<Value> {
    let list: Vec<Value> = Preset::ALL
        .iter()
        .map(|p| {
            let (w_sep, w_ali, w_coh) = p.weights();
            json!({ "name": p.as_str(), "w_sep": w_sep, "w_ali": w_ali, "w_coh": w_coh })
        })
        .collect();
    Json(Value::Array(list))
}

async fn apply_preset(
    State(s): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator, "applying a preset")?;
    let preset: Preset = name.parse().map_err(|_| {
        ApiError::not_found(format!("no preset {name:?}: allowed {}", Preset::ALLOWED))
    })?;
    let a = s.submit(Op::Preset(preset)).await?;
    Ok(Json(json!({ "tick": a.tick, "params": s.state().params })))
}

// ---- agents --------------------------------------------------------------

/// `POST /predators`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PredatorBody {
    mode: Option<PredatorMode>,
    position: Option<Vec3>,
    max_speed_mps: Option<f32>,
    ttl_s: Option<f32>,
}

/// `POST /goals`: `at` for a point goal, or `waypoints` (and `looping`).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GoalBody {
    at: Option<Vec3>,
    waypoints: Option<Vec<Vec3>>,
    looping: Option<bool>,
    arrive_radius_m: Option<f32>,
    ttl_s: Option<f32>,
}

/// Default goal arrive radius, metres.
const ARRIVE_RADIUS_M: f32 = 8.0;

/// `POST /obstacles`: exactly one of `sphere` and `box`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ObstacleBody {
    sphere: Option<SphereBody>,
    #[serde(rename = "box")]
    aabb: Option<BoxBody>,
    ttl_s: Option<f32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SphereBody {
    center: Vec3,
    radius_m: f32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BoxBody {
    min: Vec3,
    max: Vec3,
}

/// `PATCH /{kind}/{id}`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MoveBody {
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
    s.check_pilot_cap(caller.role, &caller.key)?;
    let a = s.submit(op).await?;
    s.record_pilot_agent(caller.role, &caller.key, a.created_id);
    Ok(a)
}

async fn add_predator(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<PredatorBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let op = Op::AddPredator {
        mode: b.mode.unwrap_or(PredatorMode::Static),
        position: required(b.position, "position", "[x, y, z] in metres")?,
        max_speed_mps: b.max_speed_mps,
        ttl_s: b.ttl_s,
    };
    let a = create_agent(&s, &caller, op, "adding a predator").await?;
    Ok(applied(StatusCode::CREATED, a))
}

async fn add_goal(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<GoalBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
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

async fn add_obstacle(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<ObstacleBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
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
) -> Result<Json<Value>, ApiError> {
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
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Pilot, "removing an agent")?;
    s.check_rate(caller.role, &caller.key)?;
    check_kind(&s, id, kind)?;
    let a = s.submit(Op::RemoveAgent { id }).await?;
    Ok(applied(StatusCode::OK, a).1)
}

async fn move_predator(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
    Body(b): Body<MoveBody>,
) -> Result<Json<Value>, ApiError> {
    move_agent(s, c, id, AgentKind::Predator, b).await
}
async fn move_goal(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
    Body(b): Body<MoveBody>,
) -> Result<Json<Value>, ApiError> {
    move_agent(s, c, id, AgentKind::Goal, b).await
}
async fn move_obstacle(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
    Body(b): Body<MoveBody>,
) -> Result<Json<Value>, ApiError> {
    move_agent(s, c, id, AgentKind::Obstacle, b).await
}
async fn remove_predator(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
) -> Result<Json<Value>, ApiError> {
    remove_agent(s, c, id, AgentKind::Predator).await
}
async fn remove_goal(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
) -> Result<Json<Value>, ApiError> {
    remove_agent(s, c, id, AgentKind::Goal).await
}
async fn remove_obstacle(
    State(s): State<Shared>,
    c: Caller,
    Path(id): Path<u32>,
) -> Result<Json<Value>, ApiError> {
    remove_agent(s, c, id, AgentKind::Obstacle).await
}

async fn list_predators(State(s): State<Shared>) -> Json<Value> {
    Json(json!(s.state().agents.predators()))
}
async fn list_goals(State(s): State<Shared>) -> Json<Value> {
    Json(json!(s.state().agents.goals()))
}
async fn list_obstacles(State(s): State<Shared>) -> Json<Value> {
    Json(json!(s.state().agents.obstacles()))
}

// ---- boids -----------------------------------------------------------------

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SpawnBody {
    center: Option<Vec3>,
    count: Option<usize>,
    spread_m: Option<f32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RemoveBoidsBody {
    ids: Vec<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PopulationBody {
    population: Option<usize>,
}

async fn spawn_boids(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<SpawnBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Role::Operator, "spawning boids")?;
    let op = Op::SpawnBoids {
        center: required(b.center, "center", "[x, y, z] in metres")?,
        count: required(b.count, "count", "how many boids")?,
        spread_m: b.spread_m.unwrap_or(5.0),
    };
    Ok(applied(StatusCode::CREATED, s.submit(op).await?))
}

async fn remove_boids(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<RemoveBoidsBody>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator, "removing boids")?;
    Ok(applied(
        StatusCode::OK,
        s.submit(Op::RemoveBoids { ids: b.ids }).await?,
    )
    .1)
}

async fn set_population(
    State(s): State<Shared>,
    caller: Caller,
    Body(b): Body<PopulationBody>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator, "setting the population")?;
    let population = required(b.population, "population", "the number of boids wanted")?;
    Ok(applied(
        StatusCode::OK,
        s.submit(Op::SetPopulation { population }).await?,
    )
    .1)
}

// ---- control ---------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepBody {
    n: u32,
}

impl Default for StepBody {
    fn default() -> Self {
        Self { n: 1 }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    seed: Option<u64>,
}

async fn control(s: Shared, caller: Caller, op: Op) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator, op.kind())?;
    let a = s.submit(op).await?;
    let st = s.state();
    Ok(Json(
        json!({ "tick": a.tick, "now": st.tick, "paused": st.paused }),
    ))
}

async fn pause(State(s): State<Shared>, c: Caller) -> Result<Json<Value>, ApiError> {
    control(s, c, Op::Pause).await
}
async fn resume(State(s): State<Shared>, c: Caller) -> Result<Json<Value>, ApiError> {
    control(s, c, Op::Resume).await
}
async fn step(
    State(s): State<Shared>,
    c: Caller,
    Body(b): Body<StepBody>,
) -> Result<Json<Value>, ApiError> {
    control(s, c, Op::Step { n: b.n }).await
}
async fn reset(
    State(s): State<Shared>,
    c: Caller,
    Body(b): Body<ResetBody>,
) -> Result<Json<Value>, ApiError> {
    control(s, c, Op::Reset { seed: b.seed }).await
}

// ---- state and metrics -----------------------------------------------------

/// `GET /state`.
#[derive(Debug, Serialize)]
struct StateBody {
    tick: u64,
    population: usize,
    paused: bool,
    tick_hz: u32,
    step_ms: f32,
    missed_ticks: u64,
    viewers: usize,
}

async fn state(State(s): State<Shared>) -> Json<StateBody> {
    let st = s.state();
    Json(StateBody {
        tick: st.tick,
        population: st.population,
        paused: st.paused,
        tick_hz: st.params.tick_hz,
        step_ms: st.metrics.step_ms,
        missed_ticks: st.missed_ticks,
        viewers: s.0.viewers.load(std::sync::atomic::Ordering::Relaxed),
    })
}

async fn metrics(State(s): State<Shared>) -> Json<starling_sim::TickMetrics> {
    Json(s.state().metrics)
}
