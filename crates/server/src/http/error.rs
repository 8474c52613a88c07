//! The one error type handlers return: over REST a 4xx (or 503) JSON body
//! `{error, field, detail}`, over the WebSocket an `Error` message with the
//! matching [`ErrorCode`]. Never a 5xx for bad input.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use starling_protocol::ErrorCode;
use starling_sim::SimError;

use crate::command::OpError;

/// A refused request.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Short machine-readable class (`invalid`, `forbidden`, `not_found`, ...).
    pub error: &'static str,
    /// The field at fault, if one is.
    pub field: Option<String>,
    /// What was wrong and what is allowed.
    pub detail: String,
    /// Certainly not applied, through no fault of the request (a full
    /// queue, an op given up on, a loop stopped first): a 503 whose op
    /// may be sent again at once. `Shared::not_applied` gives the pilot's
    /// rate token back with it; an origin tells the edge, which does too.
    pub not_applied: bool,
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    field: Option<&'a str>,
    detail: &'a str,
}

impl ApiError {
    /// An error of class `error` (one of [`ApiError::CLASSES`]) with its
    /// status, the field at fault if one is, and what was wrong.
    pub fn new(
        status: StatusCode,
        error: &'static str,
        field: Option<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            error,
            field,
            detail: detail.into(),
            not_applied: false,
        }
    }

    /// A 400/422-style error naming a field.
    pub fn invalid(status: StatusCode, field: Option<String>, detail: impl Into<String>) -> Self {
        Self::new(status, "invalid", field, detail)
    }

    /// 403.
    pub fn forbidden(field: Option<String>, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", field, detail)
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", None, detail)
    }

    /// 503: the command queue is full or the loop is stopping.
    pub fn busy(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "busy", None, detail)
    }

    /// 503 for an op certainly not applied, through no fault of the request.
    pub fn not_applied(detail: impl Into<String>) -> Self {
        Self {
            not_applied: true,
            ..Self::busy(detail)
        }
    }

    /// 429.
    pub fn rate_limited(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", None, detail)
    }

    /// 409 for caps and state conflicts.
    pub fn conflict(error: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, error, None, detail)
    }
}

impl ApiError {
    /// Every error class, as REST bodies name them.
    pub const CLASSES: [&'static str; 8] = [
        "invalid",
        "forbidden",
        "not_found",
        "limit_reached",
        "rate_limited",
        "busy",
        "unsupported",
        "conflict",
    ];

    /// The class named `name` (one received from elsewhere, such as an
    /// origin's answer to an edge), `invalid` when it is none of them.
    pub fn class(name: &str) -> &'static str {
        Self::CLASSES
            .into_iter()
            .find(|c| *c == name)
            .unwrap_or("invalid")
    }

    /// The WebSocket error code of the same class.
    pub fn code(&self) -> ErrorCode {
        match self.error {
            "forbidden" => ErrorCode::Forbidden,
            "not_found" => ErrorCode::NotFound,
            "limit_reached" => ErrorCode::LimitReached,
            "rate_limited" => ErrorCode::RateLimited,
            "busy" => ErrorCode::Busy,
            "unsupported" => ErrorCode::Unsupported,
            _ => ErrorCode::BadRequest,
        }
    }
}

impl From<OpError> for ApiError {
    fn from(e: OpError) -> Self {
        let detail = e.to_string();
        match e {
            OpError::Sim(SimError::Invalid(p)) => Self::invalid(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(p.field.to_owned()),
                format!("{} = {}: allowed {}", p.field, p.value, p.allowed),
            ),
            OpError::Sim(e @ (SimError::UnknownAgent { .. } | SimError::UnknownBoid { .. })) => {
                Self::not_found(e.to_string())
            }
            OpError::Sim(e @ SimError::Capacity { .. }) => {
                Self::conflict("limit_reached", e.to_string())
            }
            OpError::Sim(e @ SimError::NotEnough { .. }) => Self {
                field: Some("count".into()),
                ..Self::conflict("conflict", e.to_string())
            },
            OpError::Sim(e) => Self::conflict("unsupported", e.to_string()),
            OpError::BadInput { field, detail } => {
                Self::invalid(StatusCode::UNPROCESSABLE_ENTITY, field, detail)
            }
            OpError::NotFound(d) => Self::not_found(d),
            OpError::Forbidden { .. } => Self::forbidden(None, detail),
            OpError::NotOwner { .. } => Self::forbidden(Some("id".into()), detail),
            OpError::LimitReached(d) => Self::conflict("limit_reached", d),
            OpError::Conflict(d) => Self::conflict("conflict", d),
            OpError::Stopped => Self::busy(detail),
            OpError::NotApplied(_) => Self::not_applied(detail),
            OpError::Remote {
                status,
                error,
                field,
                detail,
            } => Self::new(
                StatusCode::from_u16(status)
                    .ok()
                    .filter(|s| s.is_client_error() || s.is_server_error())
                    .unwrap_or(StatusCode::BAD_REQUEST),
                Self::class(&error),
                field,
                detail,
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: self.error,
            field: self.field.as_deref(),
            detail: &self.detail,
        };
        (self.status, Json(body)).into_response()
    }
}
