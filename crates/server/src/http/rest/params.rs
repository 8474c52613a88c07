//! `/params`: read and patch the parameters, list and apply presets.

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use starling_sim::{Params, ParamsPatch, Preset};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ErrorBody;
use super::extract::{Body, Caller};
use crate::command::{Op, OpError};
use crate::http::error::ApiError;
use crate::http::shared::Shared;

pub(super) fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(get_params, patch_params))
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

/// A preset's weights.
#[derive(Debug, Serialize, ToSchema)]
struct PresetInfo {
    /// Name, for `POST /params/presets/{name}`.
    name: &'static str,
    /// Separation weight.
    w_sep: f32,
    /// Alignment weight.
    w_ali: f32,
    /// Cohesion weight.
    w_coh: f32,
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
    Caller(actor): Caller,
    Path(name): Path<String>,
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
