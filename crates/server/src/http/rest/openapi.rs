//! The OpenAPI document as served: generated from the handlers'
//! annotations, then the parameter schemas (`Params`, `ParamsPatch`) get
//! their ranges and defaults from the sim's parameter table, so the
//! document and the validation can never disagree.

use serde_json::{Value, json};
use starling_sim::Params;
use starling_sim::params::{Bounds, DIMS, FloatRange, SPECS, Value as ParamValue, ranges};

/// The served document.
pub(super) fn document(doc: &utoipa::openapi::OpenApi) -> Value {
    let mut doc = serde_json::to_value(doc).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the OpenAPI document does not serialise");
        Value::Null
    });
    let schemas = &mut doc["components"]["schemas"];
    annotate(&mut schemas["Params"], true);
    annotate(&mut schemas["ParamsPatch"], false);
    doc
}

/// Adds `minimum`/`maximum` (or `exclusiveMinimum`) to each parameter's
/// property, and its default when `defaults`.
fn annotate(schema: &mut Value, defaults: bool) {
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
        let items = world.entry("items").or_insert_with(|| json!({}));
        if let Some(items) = items.as_object_mut() {
            float_range(items, ranges::WORLD_M);
        }
        if defaults {
            world.insert("default".into(), json!(base.world_m));
        }
    }
    if let Some(dims) = props.get_mut("dims").and_then(Value::as_object_mut) {
        dims.insert("minimum".into(), json!(DIMS[0]));
        dims.insert("maximum".into(), json!(DIMS[DIMS.len() - 1]));
        if defaults {
            dims.insert("default".into(), json!(base.dims));
        }
    }
}

/// `minimum` (or `exclusiveMinimum`) and `maximum` of a float range.
fn float_range(prop: &mut serde_json::Map<String, Value>, r: FloatRange) {
    let key = if r.min_exclusive {
        "exclusiveMinimum"
    } else {
        "minimum"
    };
    prop.insert(key.into(), json!(r.min));
    prop.insert("maximum".into(), json!(r.max));
}
