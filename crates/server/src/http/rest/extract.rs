//! What REST handlers take from a request: the caller ([`Caller`]) and a
//! JSON body ([`Body`]) whose every rejection is an [`ApiError`] naming the
//! field.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::{Map, Number, Value};

use crate::command::{Actor, serde_field};
use crate::http::auth::TokenQuery;
use crate::http::error::ApiError;
use crate::http::shared::Shared;

/// Who is calling: the role and account their token grants (`?token=`,
/// else the bearer header: `TokenQuery::presented`, as the request guard
/// and the WebSocket read it).
#[derive(Debug, Clone, Copy)]
pub(super) struct Caller(pub Actor);

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &Shared) -> Result<Self, ApiError> {
        let query = Query::<TokenQuery>::try_from_uri(&parts.uri)
            .map(|Query(q)| q)
            .unwrap_or_default();
        Ok(Caller(s.0.tokens.actor(query.presented(&parts.headers))))
    }
}

/// A required JSON body: an empty one is refused (422), and a missing
/// required field is named.
#[derive(Debug)]
pub(super) struct Body<T>(pub T);

/// An optional JSON body: an empty one reads as `{}` (every field then
/// takes its default).
#[derive(Debug)]
pub(super) struct OptionalBody<T>(pub T);

/// Whether a request carries no body at all.
fn is_empty(req: &Request) -> bool {
    let h = req.headers();
    let length = h.get(CONTENT_LENGTH);
    length.is_some_and(|v| v == "0")
        || (length.is_none() && h.get(CONTENT_TYPE).is_none() && h.get(TRANSFER_ENCODING).is_none())
}

impl<T: DeserializeOwned> FromRequest<Shared> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &Shared) -> Result<Self, ApiError> {
        if is_empty(&req) {
            return Err(body_required());
        }
        parse(req, s, false).await.map(Body)
    }
}

impl<T: DeserializeOwned> FromRequest<Shared> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &Shared) -> Result<Self, ApiError> {
        if is_empty(&req) {
            return typed(Value::Object(Map::new())).map(OptionalBody);
        }
        parse(req, s, true).await.map(OptionalBody)
    }
}

/// Reads a JSON body (size, media type and syntax checked by axum) into
/// `T`. Numbers with no fraction are integers, as JSON Schema says (`385.0`
/// is a valid count). `null` is no body: allowed only when `optional`.
async fn parse<T: DeserializeOwned>(
    req: Request,
    s: &Shared,
    optional: bool,
) -> Result<T, ApiError> {
    let Json(mut v) = Json::<Value>::from_request(req, s)
        .await
        .map_err(json_error)?;
    if v.is_null() {
        if !optional {
            return Err(body_required());
        }
        v = Value::Object(Map::new());
    }
    if !v.is_object() {
        // serde would take a list of a struct's fields in order; the API
        // takes objects.
        return Err(ApiError::invalid(
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            "the body must be a JSON object (see /api/v1/openapi.json)",
        ));
    }
    whole_numbers(&mut v);
    typed(v)
}

fn body_required() -> ApiError {
    ApiError::invalid(
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
        "this request needs a JSON body (see /api/v1/openapi.json)",
    )
}

/// `v` as `T`; an error names the path to the field at fault.
fn typed<T: DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        let field = serde_field(&msg)
            .map(str::to_owned)
            .or((path != ".").then(|| path.clone()));
        let detail = if path == "." {
            msg
        } else {
            format!("{path}: {msg}")
        };
        ApiError::invalid(StatusCode::UNPROCESSABLE_ENTITY, field, detail)
    })
}

/// Turns every number with no fraction (`385.0`) into an integer, when
/// one can hold it exactly.
fn whole_numbers(v: &mut Value) {
    match v {
        // A whole f64 is an exact integer: the casts below lose nothing.
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(x) if x.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&x) => {
                *n = Number::from(x as u64);
            }
            Some(x) if x.fract() == 0.0 && (-9_223_372_036_854_775_808.0..0.0).contains(&x) => {
                *n = Number::from(x as i64);
            }
            _ => {}
        },
        Value::Array(a) => a.iter_mut().for_each(whole_numbers),
        Value::Object(m) => m.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

/// An agent id in the path; anything but a whole number is a 400 naming `id`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PathId(pub u32);

impl FromRequestParts<Shared> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &Shared) -> Result<Self, ApiError> {
        let what = format!("an agent id is a whole number 0 ..= {}", u32::MAX);
        path_param(parts, s, "id", &what).await.map(PathId)
    }
}

/// A `{name}` path segment, with axum's rejection (an escaped byte that
/// is not UTF-8, say `%FF`) as `{error, field, detail}` like every other.
pub(super) struct PathName(pub String);

impl FromRequestParts<Shared> for PathName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &Shared) -> Result<Self, ApiError> {
        path_param(parts, s, "name", "a name is UTF-8 text")
            .await
            .map(PathName)
    }
}

/// The one path parameter, or a 400 naming `field` with axum's rejection
/// and what the parameter is (`what`).
async fn path_param<T: serde::de::DeserializeOwned + Send>(
    parts: &mut Parts,
    s: &Shared,
    field: &str,
    what: &str,
) -> Result<T, ApiError> {
    match Path::<T>::from_request_parts(parts, s).await {
        Ok(Path(v)) => Ok(v),
        Err(e) => Err(ApiError::invalid(
            StatusCode::BAD_REQUEST,
            Some(field.into()),
            format!("{}: {what}", e.body_text()),
        )),
    }
}

/// Turns axum's JSON rejection into `{error, field, detail}`; the field is
/// the path serde reports (`w_sep`, `position[1]`) or the name of an
/// unknown or missing field.
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
    let field = match serde_field(&detail) {
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
