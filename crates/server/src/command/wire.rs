//! Between the protocol's types and the sim's, both ways: a WebSocket
//! [`Command`] becomes an [`Op`]; the flock's agents, metrics and
//! parameters become what viewers are sent. Pure functions, no I/O.

use starling_protocol::{
    AgentList, Command, GoalInfo, Metrics, ObstacleInfo, ParamInfo, ParamValue, PredatorInfo,
};
use starling_sim::params::{Bounds, SPECS, Value};
use starling_sim::{
    Flock, GoalKind, Params, ParamsPatch, PredatorMode, Preset, Shape, SwarmMetrics, TickMetrics,
    Vec3,
};

use super::spec::{DEFAULT_ARRIVE_RADIUS_M, looping_point};
use super::{Amount, Op, OpError, Selection};

fn vec3(v: [f32; 3]) -> Vec3 {
    Vec3::from_array(v)
}

fn mode_from_wire(m: starling_protocol::PredatorMode) -> PredatorMode {
    match m {
        starling_protocol::PredatorMode::Static => PredatorMode::Static,
        starling_protocol::PredatorMode::Pointer => PredatorMode::Pointer,
        starling_protocol::PredatorMode::Hunter => PredatorMode::Hunter,
    }
}

fn mode_to_wire(m: PredatorMode) -> starling_protocol::PredatorMode {
    match m {
        PredatorMode::Static => starling_protocol::PredatorMode::Static,
        PredatorMode::Pointer => starling_protocol::PredatorMode::Pointer,
        PredatorMode::Hunter => starling_protocol::PredatorMode::Hunter,
    }
}

/// The op a WebSocket command asks for (defaults as over REST).
pub fn op_from_command(command: Command) -> Result<Op, OpError> {
    Ok(match command {
        Command::AddPredator {
            mode,
            position,
            ttl_s,
        } => Op::AddPredator {
            mode: mode_from_wire(mode),
            position: vec3(position),
            max_speed_mps: None,
            ttl_s,
        },
        Command::AddGoal {
            position,
            waypoints,
            looping,
            ttl_s,
        } => Op::AddGoal {
            kind: if waypoints.is_empty() {
                if looping {
                    return Err(looping_point());
                }
                GoalKind::Point {
                    position: vec3(position),
                }
            } else {
                GoalKind::Path {
                    waypoints: waypoints.into_iter().map(vec3).collect(),
                    looping,
                }
            },
            arrive_radius_m: DEFAULT_ARRIVE_RADIUS_M,
            ttl_s,
        },
        Command::AddObstacle { shape, ttl_s } => Op::AddObstacle {
            shape: match shape {
                starling_protocol::Shape::Sphere { center, radius_m } => Shape::Sphere {
                    center: vec3(center),
                    radius_m,
                },
                starling_protocol::Shape::Box { min, max } => Shape::Box {
                    min: vec3(min),
                    max: vec3(max),
                },
            },
            ttl_s,
        },
        Command::MoveAgent { id, position } => Op::MoveAgent {
            id,
            position: vec3(position),
        },
        Command::RemoveAgent { id } => Op::RemoveAgent { id },
        Command::SpawnBoids {
            center,
            count,
            spread_m,
        } => Op::SpawnBoids {
            center: vec3(center),
            count: count as usize,
            spread_m,
        },
        Command::PatchParams { changes } => Op::PatchParams(Box::new(patch_from(&changes)?)),
        Command::Preset { name } => Op::Preset(name.parse::<Preset>().map_err(|_| {
            OpError::NotFound(format!("no preset {name:?}: allowed {}", Preset::ALLOWED))
        })?),
        Command::Pause => Op::Pause,
        Command::Resume => Op::Resume,
        Command::Step { n } => Op::Step { n },
        Command::Reset { seed } => Op::Reset { seed },
        Command::KillBoids { count } => Op::KillBoids(Amount::Count(count as usize)),
        Command::FreezeBoids { count } => Op::FreezeBoids(Selection::Count(count as usize)),
        Command::ThawBoids => Op::Thaw { ids: None },
        Command::Seek { tick } => Op::Seek { tick },
        Command::SetPopulation { count } => Op::SetPopulation {
            population: count as usize,
        },
    })
}

/// A parameter patch from `(name, value)` pairs, through the same serde
/// path as REST (so unknown names and wrong types are refused alike).
pub fn patch_from(changes: &[(String, ParamValue)]) -> Result<ParamsPatch, OpError> {
    let mut obj = serde_json::Map::new();
    for (name, v) in changes {
        let value = match v {
            // Whole numbers as integers, so count parameters (k_nearest,
            // tick_hz, latency_ticks) accept them.
            ParamValue::Number(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                serde_json::Value::Number(serde_json::Number::from(*x as i64))
            }
            ParamValue::Number(x) if x.abs() > f64::from(f32::MAX) => {
                return Err(OpError::BadInput {
                    field: Some(name.clone()),
                    detail: beyond_f32(name, *x),
                });
            }
            ParamValue::Number(x) => serde_json::Number::from_f64(*x)
                .map(serde_json::Value::Number)
                .ok_or_else(|| OpError::BadInput {
                    field: Some(name.clone()),
                    detail: format!("{name} = {x}: allowed a finite number"),
                })?,
            ParamValue::Text(t) => serde_json::Value::String(t.clone()),
        };
        if obj.insert(name.clone(), value).is_some() {
            return Err(OpError::BadInput {
                field: Some(name.clone()),
                detail: format!("{name} is changed twice in one patch: allowed once"),
            });
        }
    }
    from_json(serde_json::Value::Object(obj))
        .map_err(|(field, detail)| OpError::BadInput { field, detail })
}

/// `v` as `T` (a REST body, a WebSocket patch); an error gives the field
/// at fault (serde's name for an unknown, missing or repeated one, else
/// the path to it) and what was wrong.
pub fn from_json<T: serde::de::DeserializeOwned>(
    v: serde_json::Value,
) -> Result<T, (Option<String>, String)> {
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
        (field, detail)
    })
}

/// The refusal of a number no f32 holds, which every number the API
/// takes fits (read as one, it would be infinity, and named so).
pub fn beyond_f32(field: &str, x: f64) -> String {
    format!("{field} = {x:e}: allowed a number within ±{:e}", f32::MAX)
}

/// The field serde names in an "unknown field `x`", "missing field `x`"
/// or "duplicate field `x`" message, if it is one.
pub fn serde_field(msg: &str) -> Option<&str> {
    ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|p| msg.split(p).nth(1)?.split('`').next())
}

/// Every scalar parameter as viewers show it: value and allowed range from
/// the sim's table (a bound another parameter sets is applied).
pub fn param_infos(p: &Params) -> Vec<ParamInfo> {
    SPECS
        .iter()
        .map(|spec| {
            let range = spec.range_in(p);
            ParamInfo {
                name: spec.name.to_owned(),
                value: match spec.value(p) {
                    Value::Number(x) => ParamValue::Number(x),
                    Value::Text(t) => ParamValue::Text(t.to_owned()),
                },
                min: range.map(|r| r.0),
                max: range.map(|r| r.1),
                choices: match spec.bounds {
                    Bounds::Choice(words) => words.iter().map(|&w| w.to_owned()).collect(),
                    _ => Vec::new(),
                },
                live: true,
            }
        })
        .collect()
}

/// The flock's agents as viewers get them.
pub fn agent_list(f: &Flock) -> AgentList {
    let a = f.agents();
    AgentList {
        tick: f.tick(),
        predators: a
            .predators()
            .iter()
            .map(|p| PredatorInfo {
                id: p.id,
                mode: mode_to_wire(p.mode),
                position: p.position.to_array(),
                velocity: p.velocity.to_array(),
            })
            .collect(),
        goals: a
            .goals()
            .iter()
            .map(|g| {
                let (waypoints, looping) = match &g.kind {
                    GoalKind::Point { .. } => (Vec::new(), false),
                    GoalKind::Path { waypoints, looping } => {
                        (waypoints.iter().map(|w| w.to_array()).collect(), *looping)
                    }
                };
                GoalInfo {
                    id: g.id,
                    target: g.target().to_array(),
                    waypoints,
                    looping,
                    arrive_radius_m: g.arrive_radius_m,
                }
            })
            .collect(),
        obstacles: a
            .obstacles()
            .iter()
            .map(|o| ObstacleInfo {
                id: o.id,
                shape: match o.shape {
                    Shape::Sphere { center, radius_m } => starling_protocol::Shape::Sphere {
                        center: center.to_array(),
                        radius_m,
                    },
                    Shape::Box { min, max } => starling_protocol::Shape::Box {
                        min: min.to_array(),
                        max: max.to_array(),
                    },
                },
            })
            .collect(),
    }
}

/// The metrics message viewers get: the flock's tick, population and
/// pause state now, the last step's metrics and the sampled swarm metrics.
pub fn metrics_msg(
    (now, population, paused): (u64, usize, bool),
    tick: &TickMetrics,
    swarm: &SwarmMetrics,
) -> Metrics {
    Metrics {
        tick: now,
        population: population as u32,
        order: tick.order,
        mean_speed_mps: tick.mean_speed_mps,
        min_nn_m: tick.min_nn_m,
        mean_nn_m: tick.mean_nn_m,
        tick_ms: tick.step_ms,
        paused,
        collisions: swarm.collisions as u32,
        collision_ratio: swarm.collision_ratio,
        clusters: swarm.clusters as u32,
        largest_cluster: swarm.largest_cluster as u32,
        obstacle_clearance_m: swarm.obstacle_clearance_m,
        goal_distance_m: swarm.goal_distance_m,
        velocity_correlation: swarm.velocity_correlation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_list_carries_the_sims_ranges() {
        let p = Params::default();
        let infos = param_infos(&p);
        assert_eq!(infos.len(), SPECS.len());
        let find = |n: &str| infos.iter().find(|i| i.name == n).unwrap();
        assert_eq!(
            (find("fov_deg").min, find("fov_deg").max),
            (Some(0.0), Some(360.0))
        );
        assert_eq!(find("k_nearest").max, Some(32.0));
        // A bound another parameter sets narrows the range shown.
        assert_eq!(find("min_speed_mps").max, Some(f64::from(p.max_speed_mps)));
        assert_eq!(find("edge_margin_m").max, Some(40.0));
        assert_eq!(find("boundary").choices, ["soft", "wrap", "bounce"]);
        assert_eq!(find("w_sep").value, ParamValue::Number(f64::from(p.w_sep)));
    }

    #[test]
    fn the_table_covers_every_parameter() {
        let v = serde_json::to_value(Params::default()).unwrap();
        let mut fields: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        // The two that shape the world are checked apart from the table.
        let mut named: Vec<&str> = SPECS
            .iter()
            .map(|s| s.name)
            .chain(["world_m", "dims"])
            .collect();
        fields.sort_unstable();
        named.sort_unstable();
        assert_eq!(fields, named);
    }

    #[test]
    fn a_wire_patch_is_refused_naming_the_field() {
        let e = patch_from(&[("w_bogus".into(), ParamValue::Number(1.0))]).unwrap_err();
        assert!(matches!(e, OpError::BadInput { field: Some(f), .. } if f == "w_bogus"));
        let e = patch_from(&[("w_sep".into(), ParamValue::Number(f64::NAN))]).unwrap_err();
        assert!(matches!(e, OpError::BadInput { field: Some(f), .. } if f == "w_sep"));
        let p = patch_from(&[("k_nearest".into(), ParamValue::Number(5.0))]).unwrap();
        assert_eq!(p.k_nearest, Some(5));
        // A wrong type names its field (it named none).
        let e = patch_from(&[("w_sep".into(), ParamValue::Text("x".into()))]).unwrap_err();
        assert!(
            matches!(&e, OpError::BadInput { field: Some(f), .. } if f == "w_sep"),
            "{e}"
        );
        let e = patch_from(&[("w_sep".into(), ParamValue::Number(1e39))]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "w_sep = 1e39: allowed a number within ±3.4028235e38"
        );
        // A name given twice is refused (the last one won).
        let e = patch_from(&[
            ("w_sep".into(), ParamValue::Number(99.0)),
            ("w_sep".into(), ParamValue::Number(2.0)),
        ])
        .unwrap_err();
        assert!(
            matches!(&e, OpError::BadInput { field: Some(f), .. } if f == "w_sep"),
            "{e}"
        );
        assert!(e.to_string().contains("twice"), "{e}");
    }

    /// A point goal that asks to loop is refused, naming `looping` (the
    /// flag was dropped); a path may loop.
    #[test]
    fn a_looping_point_goal_is_refused() {
        let goal = |waypoints: Vec<[f32; 3]>| Command::AddGoal {
            position: [1.0, 2.0, 3.0],
            waypoints,
            looping: true,
            ttl_s: None,
        };
        let e = op_from_command(goal(Vec::new())).unwrap_err();
        assert!(
            matches!(&e, OpError::BadInput { field: Some(f), .. } if f == "looping"),
            "{e}"
        );
        assert!(op_from_command(goal(vec![[1.0, 2.0, 3.0]])).is_ok());
    }
}
