//! The OpenAPI document as served: generated from the handlers'
//! annotations, then made exact from the constants the server checks
//! against, so the document and the validation cannot disagree:
//! - parameter ranges and defaults from the sim's table (`SPECS`);
//! - agent and boid numbers from `agents::ranges` and the caps;
//! - points are three numbers within the coordinate range;
//! - unsigned integers say their real maximum (not a signed format's);
//! - "exactly one of" bodies carry `oneOf`.
//!
//! Number bounds are exact for the `f32` the server keeps: a bound is
//! where JSON numbers start rounding to a refused `f32`, so the schema
//! allows exactly what the server accepts.

use serde_json::{Map, Value, json};
use starling_sim::Params;
use starling_sim::agents::{MAX_WAYPOINTS, ranges as agent};
use starling_sim::params::{Bounds, DIMS, FloatRange, SPECS, Value as ParamValue, ranges};

use crate::command::MAX_STEP_TICKS;
use crate::engine::history::HISTORY_MAX_S;

/// The served document.
pub(super) fn document(doc: &utoipa::openapi::OpenApi, max_population: usize) -> Value {
    let mut doc = serde_json::to_value(doc).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the OpenAPI document does not serialise");
        Value::Null
    });
    let schemas = &mut doc["components"]["schemas"];
    annotate_params(&mut schemas["Params"], true);
    annotate_params(&mut schemas["ParamsPatch"], false);
    let floats = [
        ("PredatorSpec", "max_speed_mps", agent::PREDATOR_SPEED_MPS),
        ("PredatorSpec", "ttl_s", agent::TTL_S),
        ("GoalSpec", "ttl_s", agent::TTL_S),
        ("GoalSpec", "arrive_radius_m", agent::ARRIVE_RADIUS_M),
        ("ObstacleSpec", "ttl_s", agent::TTL_S),
        ("SphereSpec", "radius_m", agent::SPHERE_RADIUS_M),
        ("SpawnBody", "spread_m", agent::SPREAD_M),
    ];
    for (schema, field, r) in floats {
        if let Some(p) = property(schemas, schema, field) {
            float_range(p, r);
        }
    }
    let population = max_population as u64;
    let counts = [
        ("SpawnBody", "count", 0, population),
        ("PopulationBody", "population", 0, population),
        ("KillBody", "count", 0, population),
        ("FreezeBody", "count", 0, population),
        ("StepBody", "n", 1, u64::from(MAX_STEP_TICKS)),
    ];
    for (schema, field, min, max) in counts {
        if let Some(p) = property(schemas, schema, field) {
            p.insert("minimum".into(), json!(min));
            p.insert("maximum".into(), json!(max));
            p.remove("format");
        }
    }
    for schema in ["KillBody", "FreezeBody"] {
        if let Some(p) = property(schemas, schema, "fraction") {
            p.insert("minimum".into(), json!(0.0));
            p.insert("maximum".into(), json!(1.0));
        }
    }
    if let Some(p) = property(schemas, "GoalSpec", "waypoints") {
        p.insert("minItems".into(), json!(1));
        p.insert("maxItems".into(), json!(MAX_WAYPOINTS));
    }
    exactly_one(schemas, "GoalSpec", &["position", "waypoints"], "array");
    exactly_one(schemas, "ObstacleSpec", &["sphere", "box"], "object");
    exactly_one(schemas, "KillBody", &["count", "fraction"], "number");
    exactly_one(schemas, "FreezeBody", &["count", "fraction", "ids"], "");
    walk(&mut doc, &mut |node| {
        point(node);
        unsigned(node);
    });
    if let Some(query) = doc["paths"]["/trajectories.csv"]["get"]["parameters"].as_array_mut() {
        for p in query.iter_mut().filter(|p| p["name"] == "seconds") {
            p["schema"]["minimum"] = json!(1);
            p["schema"]["maximum"] = json!(HISTORY_MAX_S);
        }
    }
    every_operation_may_fail(&mut doc);
    doc
}

/// Any request may be refused (a foreign `Host`, a full queue, a server
/// stopping): every operation lists `4XX` and `503` with the error body.
fn every_operation_may_fail(doc: &mut Value) {
    let error = json!({
        "description": "refused: `{error, field, detail}`",
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } }
    });
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for item in paths.values_mut().filter_map(Value::as_object_mut) {
        for op in item.values_mut().filter_map(Value::as_object_mut) {
            if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
                for code in ["4XX", "503"] {
                    responses.entry(code).or_insert_with(|| error.clone());
                }
            }
        }
    }
}

fn property<'a>(
    schemas: &'a mut Value,
    schema: &str,
    field: &str,
) -> Option<&'a mut Map<String, Value>> {
    schemas
        .get_mut(schema)?
        .get_mut("properties")?
        .get_mut(field)?
        .as_object_mut()
}

/// Every object in the document, depth first.
fn walk(v: &mut Value, f: &mut impl FnMut(&mut Map<String, Value>)) {
    match v {
        Value::Object(m) => {
            f(m);
            for child in m.values_mut() {
                walk(child, f);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|c| walk(c, f)),
        _ => {}
    }
}

/// Whether a schema's `type` is, or includes, `t`.
fn is_type(m: &Map<String, Value>, t: &str) -> bool {
    match m.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(a)) => a.iter().any(|x| x == t),
        _ => false,
    }
}

/// A point (`[f32; 3]`): three numbers within the coordinate range. The
/// world's extents are annotated first and keep their own range.
fn point(m: &mut Map<String, Value>) {
    let float_items = m
        .get("items")
        .and_then(Value::as_object)
        .is_some_and(|i| is_type(i, "number") && i.get("format") == Some(&json!("float")));
    if !is_type(m, "array") || !float_items || m.contains_key("maxItems") {
        return;
    }
    m.insert("minItems".into(), json!(3));
    m.insert("maxItems".into(), json!(3));
    if let Some(items) = m.get_mut("items").and_then(Value::as_object_mut)
        && !items.contains_key("maximum")
    {
        float_range(items, agent::COORD_M);
    }
}

/// An unsigned integer: its real maximum instead of a signed format.
fn unsigned(m: &mut Map<String, Value>) {
    if !is_type(m, "integer") || m.get("minimum") != Some(&json!(0)) {
        return;
    }
    let max = match m.get("format").and_then(Value::as_str) {
        Some("int32") => u64::from(u32::MAX),
        Some("int64") => u64::MAX,
        _ => return,
    };
    m.remove("format");
    m.entry("maximum").or_insert(json!(max));
}

/// `minimum` and `maximum` of an `f32` range, exact for the `f32` the
/// server keeps: the bounds are where JSON numbers start rounding to a
/// refused `f32` (so `100.00000381469727` bounds a range `..= 100`).
fn float_range(prop: &mut Map<String, Value>, r: FloatRange) {
    let least = if r.min_exclusive {
        r.min.next_up()
    } else {
        r.min
    };
    prop.insert("minimum".into(), json!(lowest_rounding_to(least)));
    prop.insert("maximum".into(), json!(highest_rounding_to(r.max)));
    prop.remove("exclusiveMinimum");
}

/// The largest `f64` that rounds to `x` or below (ties go to even).
fn highest_rounding_to(x: f32) -> f64 {
    let mid = (f64::from(x) + f64::from(x.next_up())) / 2.0;
    if x.to_bits().is_multiple_of(2) {
        mid
    } else {
        mid.next_down()
    }
}

/// The smallest `f64` that rounds to `x` or above (ties go to even).
fn lowest_rounding_to(x: f32) -> f64 {
    let mid = (f64::from(x.next_down()) + f64::from(x)) / 2.0;
    if x.to_bits().is_multiple_of(2) {
        mid
    } else {
        mid.next_up()
    }
}

/// Exactly one of `fields` is given (not null): each branch requires one
/// of them, of `kind` (any non-null value when empty).
fn exactly_one(schemas: &mut Value, schema: &str, fields: &[&str], kind: &str) {
    let Some(s) = schemas.get_mut(schema).and_then(Value::as_object_mut) else {
        return;
    };
    let not_null = if kind.is_empty() {
        json!({ "not": { "type": "null" } })
    } else {
        json!({ "type": kind })
    };
    let branches: Vec<Value> = fields
        .iter()
        .map(|f| json!({ "required": [f], "properties": { *f: not_null.clone() } }))
        .collect();
    s.insert("oneOf".into(), Value::Array(branches));
}

/// Adds each parameter's range (and its default when `defaults`).
fn annotate_params(schema: &mut Value, defaults: bool) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    let base = Params::default();
    for spec in &SPECS {
        let Some(prop) = props.get_mut(spec.name).and_then(Value::as_object_mut) else {
            continue;
        };
        match spec.bounds {
            Bounds::Float(r) => float_range(prop, r),
            Bounds::Count { min, max } => {
                prop.insert("minimum".into(), json!(min));
                prop.insert("maximum".into(), json!(max));
                prop.remove("format");
            }
            Bounds::Choice(_) => {}
        }
        if defaults {
            let v = match spec.value(&base) {
                ParamValue::Number(x) => json!(x),
                ParamValue::Text(t) => json!(t),
            };
            prop.insert("default".into(), v);
        }
    }
    if let Some(world) = props.get_mut("world_m").and_then(Value::as_object_mut) {
        world.insert("minItems".into(), json!(3));
        world.insert("maxItems".into(), json!(3));
        if let Some(items) = world.get_mut("items").and_then(Value::as_object_mut) {
            float_range(items, ranges::WORLD_M);
        }
        if defaults {
            world.insert("default".into(), json!(base.world_m));
        }
    }
    if let Some(dims) = props.get_mut("dims").and_then(Value::as_object_mut) {
        dims.insert("minimum".into(), json!(DIMS[0]));
        dims.insert("maximum".into(), json!(DIMS[DIMS.len() - 1]));
        dims.remove("format");
        if defaults {
            dims.insert("default".into(), json!(base.dims));
        }
    }
}
