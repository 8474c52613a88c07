//! `/params`: read and patch the parameters, list and apply presets.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use starling_sim::params::{Bounds, SPECS, Value};
use starling_sim::{Group, Model, Params, ParamsPatch, Preset};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ErrorBody;
use super::extract::{Body, Caller, PathName};
use crate::command::{Op, OpError};
use crate::http::error::ApiError;
use crate::http::shared::Shared;

pub(super) fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(get_params, patch_params))
        .routes(routes!(param_schema))
        .routes(routes!(list_presets))
        .routes(routes!(apply_preset))
}

/// Parameters after a change.
#[derive(Debug, Serialize, ToSchema)]
struct ParamsChanged {
    /// The tick at whose boundary they changed.
    tick: u64,
    /// All parameters now.
    params: Params,
}

/// A parameter's value as JSON: a whole number, a number or a word.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Setting {
    /// Counts and rates.
    Whole(u64),
    /// Everything else numeric.
    Number(f32),
    /// A word (`boundary`).
    Text(&'static str),
}

impl Setting {
    fn of(bounds: Bounds, v: Value) -> Self {
        match (bounds, v) {
            (_, Value::Text(t)) => Self::Text(t),
            (Bounds::Count { .. }, Value::Number(x)) => Self::Whole(x as u64),
            (_, Value::Number(x)) => Self::Number(x as f32),
        }
    }
}

/// The schema of a [`Setting`]: a number or a word (`anyOf`: a whole
/// number is a number too).
fn number_or_word() -> utoipa::openapi::Schema {
    use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, Schema, Type};
    Schema::AnyOf(
        AnyOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::Number))
            .item(ObjectBuilder::new().schema_type(Type::String))
            .build(),
    )
}

/// What a person needs to set one parameter.
#[derive(Debug, Serialize, ToSchema)]
struct ParamDoc {
    /// Field name, as in `GET /params`.
    name: &'static str,
    /// Human label, without the unit ("Separation radius").
    label: &'static str,
    /// Unit ("m", "m/s"; empty for pure numbers).
    unit: &'static str,
    /// One line on what it does.
    help: &'static str,
    /// Its default: a number, or a word for `boundary`.
    #[schema(schema_with = number_or_word)]
    default: Setting,
    /// Smallest allowed (numbers; a bound another parameter sets is not applied).
    min: Option<f64>,
    /// Largest allowed (numbers).
    max: Option<f64>,
    /// Whether only whole numbers are allowed.
    integer: bool,
    /// Allowed words (`boundary`, `model`).
    choices: Vec<&'static str>,
    /// The models it acts under (viewers hide it under the others).
    models: Vec<&'static str>,
}

/// A group of parameters, as viewers list them.
#[derive(Debug, Serialize, ToSchema)]
struct ParamGroup {
    /// Group name (`flocking`, `swarm`, `vasarhelyi`, `olfati_saber`,
    /// `perception`, `motion`, `dynamics`, `world`, `failures`).
    name: &'static str,
    /// Its heading.
    label: &'static str,
    /// Rarely changed: viewers show it collapsed.
    collapsed: bool,
    /// Its parameters, in display order.
    params: Vec<ParamDoc>,
}

/// A preset: what it looks like and every parameter it sets.
#[derive(Debug, Serialize, ToSchema)]
struct PresetInfo {
    /// Name, for `POST /params/presets/{name}`.
    name: &'static str,
    /// One line on what it looks like.
    description: &'static str,
    /// Whether the live parameters are this preset (the first in the list
    /// that matches; none is "custom").
    active: bool,
    /// The parameters it sets and their values (the others stay).
    #[schema(value_type = Object)]
    params: std::collections::BTreeMap<&'static str, Setting>,
}

/// Every simulation parameter.
#[utoipa::path(get, path = "/params", tag = "params", responses((status = 200, body = Params)))]
async fn get_params(State(s): State<Shared>) -> Json<Params> {
    Json(s.state().params)
}

/// Changes any parameters, all or nothing (operator).
#[utoipa::path(patch, path = "/params", tag = "params", request_body = ParamsPatch,
    responses((status = 200, body = ParamsChanged), (status = "4XX", body = ErrorBody)))]
async fn patch_params(
    State(s): State<Shared>,
    Caller(actor): Caller,
    Body(patch): Body<ParamsPatch>,
) -> Result<Json<ParamsChanged>, ApiError> {
    let a = s.submit(actor, Op::PatchParams(Box::new(patch))).await?;
    Ok(Json(ParamsChanged {
        tick: a.tick,
        params: s.state().params,
    }))
}

/// Labels, units, help lines, groups and defaults of every scalar
/// parameter (what the viewer's sliders show).
#[utoipa::path(get, path = "/params/schema", tag = "params", responses((status = 200, body = Vec<ParamGroup>)))]
async fn param_schema() -> Json<Vec<ParamGroup>> {
    let defaults = Params::default();
    Json(
        Group::ALL
            .iter()
            .map(|&g| ParamGroup {
                name: g.as_str(),
                label: g.label(),
                collapsed: matches!(g, Group::Dynamics | Group::Failures),
                params: SPECS
                    .iter()
                    .filter(|s| s.group == g)
                    .map(|s| {
                        let range = s.bounds.numeric();
                        ParamDoc {
                            name: s.name,
                            label: s.label,
                            unit: s.unit,
                            help: s.help,
                            default: Setting::of(s.bounds, s.value(&defaults)),
                            min: range.map(|r| r.0),
                            max: range.map(|r| r.1),
                            integer: matches!(s.bounds, Bounds::Count { .. }),
                            choices: match s.bounds {
                                Bounds::Choice(words) => words.to_vec(),
                                _ => Vec::new(),
                            },
                            models: s.models.iter().map(Model::as_str).collect(),
                        }
                    })
                    .collect(),
            })
            .collect(),
    )
}

/// The presets, each with every parameter it sets, and which one the live
/// parameters are.
#[utoipa::path(get, path = "/params/presets", tag = "params", responses((status = 200, body = Vec<PresetInfo>)))]
async fn list_presets(State(s): State<Shared>) -> Json<Vec<PresetInfo>> {
    let active = s.state().params.preset();
    Json(
        Preset::ALL
            .iter()
            .map(|&p| {
                let target = p.params();
                PresetInfo {
                    name: p.as_str(),
                    description: p.describe(),
                    active: active == Some(p),
                    params: SPECS
                        .iter()
                        .filter(|s| p.covers(s.group))
                        .map(|s| (s.name, Setting::of(s.bounds, s.value(&target))))
                        .collect(),
                }
            })
            .collect(),
    )
}

/// Applies a preset (operator): `defaults` restores every parameter's
/// default; the others set flocking, perception and motion, and the drone
/// presets their model's terms and the dynamics too.
#[utoipa::path(post, path = "/params/presets/{name}", tag = "params",
    params(("name" = String, Path, description = "defaults | balanced | starlings-scattering | arrow-formations | fish-ball | vasarhelyi | olfati-saber")),
    responses((status = 200, body = ParamsChanged), (status = "4XX", body = ErrorBody)))]
async fn apply_preset(
    State(s): State<Shared>,
    Caller(actor): Caller,
    PathName(name): PathName,
) -> Result<Json<ParamsChanged>, ApiError> {
    let preset: Preset = name.parse().map_err(|_| {
        OpError::NotFound(format!("no preset {name:?}: allowed {}", Preset::ALLOWED))
    })?;
    let a = s.submit(actor, Op::Preset(preset)).await?;
    Ok(Json(ParamsChanged {
        tick: a.tick,
        params: s.state().params,
    }))
}
