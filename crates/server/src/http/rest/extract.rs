//! What REST handlers take from a request: the caller ([`Caller`]) and a
//! JSON body ([`Body`]) whose every rejection is an [`ApiError`] naming the
//! field.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::command::{Actor, from_json, serde_field};
use crate::http::auth::TokenQuery;
use crate::http::error::ApiError;
use crate::http::listen::{READ_BURST_BYTES, READ_BYTES_PER_S};
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

impl<T: DeserializeOwned> FromRequest<Shared> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &Shared) -> Result<Self, ApiError> {
        match parse(req, s).await? {
            Some(v) if !v.is_null() => typed(v).map(Body),
            _ => Err(body_required()),
        }
    }
}

impl<T: DeserializeOwned> FromRequest<Shared> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &Shared) -> Result<Self, ApiError> {
        match parse(req, s).await? {
            Some(v) if !v.is_null() => typed(v).map(OptionalBody),
            // No body, an empty one or `null`: every field its default.
            _ => typed(Value::Object(Map::new())).map(OptionalBody),
        }
    }
}

/// Reads a JSON body, whole within `Limits::body_deadline` (408) and at most
/// `MAX_BODY_BYTES` (413), into a JSON value: `None` when there is none
/// (whatever the headers say). It must be `application/json` (415) and
/// valid JSON with no key given twice in an object (400; serde would keep
/// the last). Numbers with no fraction are integers, as JSON Schema says
/// (`385.0` is a valid count). A body that is neither an object nor
/// `null` is refused (422): serde would take a list of a struct's fields
/// in order.
async fn parse(req: Request, s: &Shared) -> Result<Option<Value>, ApiError> {
    let json = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<mime::Mime>().ok())
        .is_some_and(|m| {
            m.type_() == "application"
                && (m.subtype() == "json" || m.suffix().is_some_and(|s| s == "json"))
        });
    let deadline = s.0.limits.body_deadline;
    let bytes = match tokio::time::timeout(deadline, Bytes::from_request(req, s)).await {
        Err(_) => {
            let secs = deadline.as_secs_f32();
            let (rate, burst) = (READ_BYTES_PER_S / 1024.0, READ_BURST_BYTES / 1024.0);
            return Err(ApiError::invalid(
                StatusCode::REQUEST_TIMEOUT,
                None,
                format!(
                    "the body did not arrive within {secs} s (allowed: the whole body within header_timeout_s, {secs} s, of the head; a socket is read at most {rate} KiB a second past a {burst} KiB burst, which its keep-alive requests share)"
                ),
            ));
        }
        Ok(Err(rej)) => {
            let status = rej.status();
            let error = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "too_large"
            } else {
                "invalid"
            };
            return Err(ApiError::new(status, error, None, rej.body_text()));
        }
        Ok(Ok(b)) => b,
    };
    if bytes.is_empty() {
        return Ok(None);
    }
    if !json {
        return Err(ApiError::invalid(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            None,
            "a body must be sent with `Content-Type: application/json`",
        ));
    }
    let mut v = unique_json(&bytes).map_err(|(path, msg)| {
        let (field, detail) = match (serde_field(&msg), path.as_str()) {
            // A key given twice, within the object at `path`.
            (Some(key), ".") => (Some(key.to_owned()), msg.clone()),
            (Some(key), at) => (Some(format!("{at}.{key}")), format!("{at}: {msg}")),
            (None, ".") => (None, format!("the body is not valid JSON: {msg}")),
            (None, at) => (Some(at.to_owned()), format!("{at}: {msg}")),
        };
        ApiError::invalid(StatusCode::BAD_REQUEST, field, detail)
    })?;
    if !(v.is_object() || v.is_null()) {
        return Err(ApiError::invalid(
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            "the body must be a JSON object (see /api/v1/openapi.json)",
        ));
    }
    if let Some((path, x)) = first_beyond_f32(&v, "") {
        // Every number the API takes fits: an f32 would read it as
        // infinity, and the error would show "inf".
        return Err(ApiError::invalid(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(path.clone()),
            crate::command::beyond_f32(&path, x),
        ));
    }
    whole_numbers(&mut v);
    Ok(Some(v))
}

/// The path and value of the first number in `v` too large for an f32,
/// if any (`path` is where `v` is).
fn first_beyond_f32(v: &Value, path: &str) -> Option<(String, f64)> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .filter(|x| x.abs() > f64::from(f32::MAX))
            .map(|x| (path.to_owned(), x)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| first_beyond_f32(x, &format!("{path}[{i}]"))),
        Value::Object(m) => m.iter().find_map(|(k, x)| {
            let at = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            first_beyond_f32(x, &at)
        }),
        _ => None,
    }
}

/// `bytes` as one JSON value in which no object gives a key twice; an
/// error is the path to where it was found (`.` for the whole) and what.
fn unique_json(bytes: &[u8]) -> Result<Value, (String, String)> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let Unique(v) = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| (e.path().to_string(), e.inner().to_string()))?;
    de.end().map_err(|e| (".".to_owned(), e.to_string()))?;
    Ok(v)
}

/// A JSON value in which no object gives a key twice.
struct Unique(Value);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E>(self, x: f64) -> Result<Value, E> {
        // JSON holds no NaN or infinity: every f64 it gives is finite.
        Ok(Number::from_f64(x).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, t: &str) -> Result<Value, E> {
        Ok(Value::String(t.to_owned()))
    }
    fn visit_string<E>(self, t: String) -> Result<Value, E> {
        Ok(Value::String(t))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut m = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if m.contains_key(&key) {
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate field `{key}` (allowed: each key once)"
                )));
            }
            let Unique(v) = map.next_value()?;
            m.insert(key, v);
        }
        Ok(Value::Object(m))
    }
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
    from_json(v).map_err(|(field, detail)| {
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
