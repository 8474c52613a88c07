//! What REST handlers take from a request: the caller ([`Caller`]) and a
//! JSON body ([`Body`]) whose every rejection is an [`ApiError`] naming the
//! field.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::command::{Actor, serde_field};
use crate::http::auth::bearer;
use crate::http::error::ApiError;
use crate::http::shared::Shared;

/// Who is calling: the role and account their bearer token grants.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caller(pub Actor);

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &Shared) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        Ok(Caller(s.0.tokens.actor(bearer(header))))
    }
}

/// A JSON body. An empty body reads as `{}`, so a body whose fields are
/// all optional may be left out, and a missing required field is named.
#[derive(Debug)]
pub(super) struct Body<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Shared> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &Shared) -> Result<Self, ApiError> {
        let h = req.headers();
        let length = h.get(CONTENT_LENGTH);
        let empty = length.is_some_and(|v| v == "0")
            || (length.is_none()
                && h.get(CONTENT_TYPE).is_none()
                && h.get(TRANSFER_ENCODING).is_none());
        let parsed = if empty {
            Json::<T>::from_bytes(b"{}")
        } else {
            Json::<T>::from_request(req, s).await
        };
        parsed.map(|Json(v)| Body(v)).map_err(json_error)
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
