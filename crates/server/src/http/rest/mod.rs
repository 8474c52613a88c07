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

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{MatchedPath, OriginalUri};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;

use crate::command::Applied;
use crate::http::error::ApiError;
use crate::http::shared::Shared;

/// The routes, to be nested under `/api/v1`, the OpenAPI document
/// (`/api/v1/openapi.json`) among them.
pub fn routes(max_population: usize) -> Router<Shared> {
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(params::routes())
        .merge(agents::routes())
        .merge(boids::routes())
        .merge(control::routes())
        .merge(state::routes())
        .split_for_parts();
    let doc = openapi::document(&doc, max_population);
    let taken = Arc::new(query_parameters(&doc));
    // Serialised once: each request is a copy of the bytes, not of the document.
    let bytes =
        axum::body::Bytes::from(serde_json::to_vec(&doc).expect("the OpenAPI document serialises"));
    router
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let bytes = bytes.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        bytes,
                    )
                }
            }),
        )
        .route_layer(axum::middleware::from_fn(move |path, req, next| {
            known_query(taken.clone(), path, req, next)
        }))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
}

/// The query parameters each route takes, by its path in the document
/// (`/trajectories.csv`), as the OpenAPI document lists them.
fn query_parameters(doc: &serde_json::Value) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        let names = out.entry(path.clone()).or_default();
        for op in item.as_object().into_iter().flat_map(|o| o.values()) {
            for p in op["parameters"].as_array().into_iter().flatten() {
                if p["in"] == "query"
                    && let Some(name) = p["name"].as_str()
                {
                    names.push(name.to_owned());
                }
            }
        }
    }
    out
}

/// Refuses a query parameter the route does not take, naming it (a
/// mistyped or unsupported one, `PATCH /params?dry_run=true` say, was
/// ignored and the change applied). `token` is taken everywhere, as a
/// request may present its token on the URL.
async fn known_query(
    taken: Arc<HashMap<String, Vec<String>>>,
    path: MatchedPath,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = path
        .as_str()
        .strip_prefix("/api/v1")
        .unwrap_or(path.as_str());
    let names = taken.get(route).map(Vec::as_slice).unwrap_or_default();
    let query = req.uri().query().unwrap_or("");
    let keys = || {
        query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| kv.split_once('=').map_or(kv, |(k, _)| k))
    };
    if keys().filter(|k| *k == TOKEN_PARAMETER).count() > 1 {
        return ApiError::invalid(
            StatusCode::BAD_REQUEST,
            Some(TOKEN_PARAMETER.into()),
            format!("{route}: allowed at most one {TOKEN_PARAMETER}="),
        )
        .into_response();
    }
    let unknown = keys().find(|k| *k != TOKEN_PARAMETER && !names.iter().any(|n| n == k));
    if let Some(key) = unknown {
        let allowed = if names.is_empty() {
            format!("none but {TOKEN_PARAMETER}")
        } else {
            format!("{}, {TOKEN_PARAMETER}", names.join(", "))
        };
        return ApiError::invalid(
            StatusCode::BAD_REQUEST,
            Some(key.to_owned()),
            format!("{route} takes no query parameter {key:?}: allowed {allowed}"),
        )
        .into_response();
    }
    next.run(req).await
}

/// The query parameter a request may present its token in on any route.
const TOKEN_PARAMETER: &str = "token";

/// An `/api/v1` path that names no resource.
async fn no_route(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::not_found(format!(
        "no {method} {uri} in this API: see /api/v1/openapi.json"
    ))
}

/// A resource asked with a method it does not take.
pub(super) async fn wrong_method(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        None,
        format!("{uri} does not take {method}: see /api/v1/openapi.json"),
    )
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Starling",
        description = "Control a live flock: parameters, agents, boids, pause/step/reset. \
            Send `Authorization: Bearer <token>` (or `?token=<token>` on the URL); \
            roles are viewer < pilot < operator. A query parameter an operation does \
            not list is refused with 400 naming it. \
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
