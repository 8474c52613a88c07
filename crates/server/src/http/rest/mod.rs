//! The REST API under `/api/v1`, one file per resource: `params.rs`,
//! `agents.rs`, `boids.rs`, `control.rs` and `state.rs`. Every change is an
//! [`Op`](crate::command::Op) submitted through [`Shared::submit`] (the same
//! door as the WebSocket's) and answered with the tick it took effect;
//! every refusal is a JSON `{error, field, detail}` with a 4xx status. The
//! OpenAPI document is generated from the handlers' annotations, with the
//! parameters' ranges filled in from the sim's table.

mod agents;
mod boids;
mod control;
mod extract;
mod openapi;
mod params;
mod state;

use axum::extract::OriginalUri;
use axum::http::{Method, StatusCode};
use axum::{Json, Router};
use serde::Serialize;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;

use crate::command::Applied;
use crate::http::error::ApiError;
use crate::http::shared::Shared;

/// The routes, to be nested under `/api/v1`, with the OpenAPI document
/// (served at `/api/v1/openapi.json`).
pub fn routes(max_population: usize) -> (Router<Shared>, serde_json::Value) {
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(params::routes())
        .merge(agents::routes())
        .merge(boids::routes())
        .merge(control::routes())
        .merge(state::routes())
        .split_for_parts();
    let router = router
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method);
    (router, openapi::document(&doc, max_population))
}

/// An `/api/v1` path that names no resource.
async fn no_route(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::not_found(format!(
        "no {method} {uri} in this API: see /api/v1/openapi.json"
    ))
}

/// A resource asked with a method it does not take.
async fn wrong_method(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        error: "method_not_allowed",
        field: None,
        detail: format!("{uri} does not take {method}: see /api/v1/openapi.json"),
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Starling",
        description = "Control a live flock: parameters, agents, boids, pause/step/reset. \
            Send `Authorization: Bearer <token>`; roles are viewer < pilot < operator. \
            Pilots may move and remove only the agents their token created. \
            Errors are `{error, field, detail}` with a 4xx status.",
    ),
    servers((url = "/api/v1")),
    components(schemas(ErrorBody))
)]
struct ApiDoc;

/// A change that took effect: the tick at whose boundary it did, and the
/// id of the agent it created.
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
            id: a.id,
        }),
    )
}

/// Every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Class: `invalid`, `forbidden`, `not_found`, `method_not_allowed`, `limit_reached`, `rate_limited`, `busy`, `conflict`, `unsupported`, `too_large`.
    pub error: String,
    /// The field at fault, when one is (`id` when a pilot touches another's agent).
    pub field: Option<String>,
    /// What was wrong and what is allowed.
    pub detail: String,
}
