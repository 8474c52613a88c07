//! Scenario files: a reproducible experiment in TOML (world, population and
//! placement, seed, parameters, agents, timed events, outputs). Every
//! validation error names the file, the line, the field and what is allowed.
//!
//! ```toml
//! name = "obstacle-course"
//! seed = 7
//! population = 2000
//! ticks = 1800                      # run length unless --ticks / --until-seconds
//!
//! [placement]                       # "uniform" (default) or a ball
//! kind = "ball"
//! center = [100, 100, 40]
//! radius_m = 30
//!
//! preset = "balanced"              # optional: a parameter preset to start from
//!
//! [params]                          # any simulation parameter, over the preset
//! world_m = [200, 200, 80]
//!
//! [output]
//! metrics_every = 10                # a metrics.csv row every N ticks
//! trajectories_every = 30           # trajectories.csv sample interval (0: none)
//!
//! [[obstacles]]
//! sphere = { center = [100, 100, 40], radius_m = 10 }
//!
//! [[goals]]
//! waypoints = [[20, 20, 40], [180, 180, 40]]
//! looping = true
//!
//! [[events]]
//! at_s = 10.0                       # or at_tick
//! kill_fraction = 0.2               # or kill_count, freeze_count, freeze_fraction, thaw,
//!                                   # patch_params (noise_m, dropout, latency_ticks, ...),
//!                                   # add_predator, add_obstacle, add_goal, remove_agent
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use starling_sim::params::{SPECS, used_only_by};
use starling_sim::{
    Flock, FlockConfig, MAX_POPULATION, Model, Params, ParamsPatch, Preset, SwarmConfig, Vec3,
};

use crate::command::{Amount, Op, OpError, Selection};
pub use crate::command::{BoxSpec, GoalSpec, ObstacleSpec, PredatorSpec, SphereSpec};

/// A scenario file, parsed and validated.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A name for reports.
    #[serde(default)]
    pub name: String,
    /// Seed of every random draw. Default 1.
    #[serde(default = "one")]
    pub seed: u64,
    /// Boids at start. Default 5000.
    #[serde(default = "default_population")]
    pub population: usize,
    /// Ticks to run unless the command line says otherwise. Default 1800.
    #[serde(default = "default_ticks")]
    pub ticks: u64,
    /// Where the boids start.
    #[serde(default)]
    pub placement: Placement,
    /// The preset the parameters start from (else every default).
    #[serde(default)]
    pub preset: Option<Preset>,
    /// The `[params]` table as written: what it changes from the preset.
    #[serde(default, rename = "params")]
    pub patch: ParamsPatch,
    /// Simulation parameters: the preset (or the defaults) with `[params]`
    /// applied, validated.
    #[serde(skip)]
    pub params: Params,
    /// Swarm-metric distances.
    #[serde(default)]
    pub swarm: SwarmConfig,
    /// What to write.
    #[serde(default)]
    pub output: Output,
    /// Obstacles at start.
    #[serde(default)]
    pub obstacles: Vec<ObstacleSpec>,
    /// Goals at start.
    #[serde(default)]
    pub goals: Vec<GoalSpec>,
    /// Predators at start.
    #[serde(default)]
    pub predators: Vec<PredatorSpec>,
    /// Timed events, at most [`MAX_EVENTS`].
    #[serde(default)]
    pub events: Vec<Event>,
}

/// The most a scenario file may hold ([`MAX_EVENTS`] events of a few
/// lines each are about 50 KB).
pub const MAX_SCENARIO_BYTES: u64 = 1 << 20;

/// Events a scenario may have: each is checked at load, and applied
/// events are listed in the report (about 7 KB each).
pub const MAX_EVENTS: usize = 1000;

fn one() -> u64 {
    1
}
fn default_population() -> usize {
    5_000
}
fn default_ticks() -> u64 {
    1_800
}

/// Initial placement.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
pub enum Placement {
    /// Uniformly at random in the world.
    #[default]
    Uniform,
    /// Uniformly in a ball.
    Ball {
        /// Centre, metres.
        center: [f32; 3],
        /// Radius, metres.
        radius_m: f32,
    },
}

/// Output settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Output {
    /// A metrics row every this many ticks (1 ..= 100000). Default 10 (the
    /// swarm metrics cost about twice a step; 1 writes every tick).
    pub metrics_every: u64,
    /// Trajectory samples every this many ticks; 0 writes none. Default 30.
    pub trajectories_every: u64,
}

impl Default for Output {
    fn default() -> Self {
        Self {
            metrics_every: 10,
            trajectories_every: 30,
        }
    }
}

/// Something that happens at a tick or a time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// The tick it happens at (before that tick is stepped).
    pub at_tick: Option<u64>,
    /// Or the simulated time, seconds.
    pub at_s: Option<f64>,
    /// Change parameters.
    pub patch_params: Option<ParamsPatch>,
    /// Kill this many boids, chosen at random from the seed; at most the
    /// population, and fewer if earlier events left fewer alive (the run's
    /// `summary.json` then lists it under `events_capped`).
    pub kill_count: Option<usize>,
    /// Kill this fraction of the boids alive (0 ..= 1).
    pub kill_fraction: Option<f64>,
    /// Freeze this many boids (dead motors), chosen at random from the
    /// seed; at most the population, and fewer if fewer are left unfrozen
    /// (listed under `events_capped`).
    pub freeze_count: Option<usize>,
    /// Freeze this fraction of the boids alive (0 ..= 1); fewer if fewer
    /// are left unfrozen (listed under `events_capped`).
    pub freeze_fraction: Option<f64>,
    /// `true`: thaw every frozen boid.
    pub thaw: Option<bool>,
    /// Add a predator.
    pub add_predator: Option<PredatorSpec>,
    /// Add an obstacle.
    pub add_obstacle: Option<ObstacleSpec>,
    /// Add a goal.
    pub add_goal: Option<GoalSpec>,
    /// Remove the agent with this id.
    pub remove_agent: Option<u32>,
}

/// A scenario error: the file, the line (when known), the field and what
/// is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}:{line}: `{field}`: {detail}")]
pub struct ScenarioError {
    /// The scenario file.
    pub file: String,
    /// 1-based line (0 when not known).
    pub line: usize,
    /// The field at fault.
    pub field: String,
    /// What is wrong and what is allowed.
    pub detail: String,
}

/// The first line of `text` that assigns `key` (`key =` or `key=`), after
/// line `from` (so an array-of-tables entry finds its own key).
fn line_of(text: &str, key: &str, from: usize) -> usize {
    text.lines()
        .enumerate()
        .skip(from.saturating_sub(1))
        .find(|(_, l)| {
            // At the line's start, or inside an inline table (`{ key = `, `, key = `).
            l.match_indices(key).any(|(at, _)| {
                let before = l[..at].trim_end();
                let after = l[at + key.len()..].trim_start();
                (before.is_empty() || before.ends_with('{') || before.ends_with(','))
                    && after.starts_with('=')
            })
        })
        .map_or(0, |(i, _)| i + 1)
}

/// The 1-based line assigning `key` within the table whose header is on
/// 1-based line `header` (up to the next header but its own sub-tables',
/// such as `[events.patch_params]`), else the header's own (a rule
/// between two parameters may name one the file did not set).
fn line_in_table(text: &str, key: &str, header: usize) -> usize {
    let name = text
        .lines()
        .nth(header.saturating_sub(1))
        .map(|l| {
            header_of(l)
                .trim_matches(|c| c == '[' || c == ']')
                .to_owned()
        })
        .unwrap_or_default();
    let sub = format!("[{name}.");
    let end = text
        .lines()
        .enumerate()
        .skip(header)
        .find(|(_, l)| {
            let l = l.trim_start();
            l.starts_with('[') && !(header > 0 && l.starts_with(&sub))
        })
        .map_or(usize::MAX, |(i, _)| i + 1);
    match line_of(text, key, header) {
        n if n != 0 && n < end => n,
        _ => header,
    }
}

/// The key assigned on 1-based `line`, under its table (`params.model`);
/// empty when the line assigns nothing.
fn key_at(text: &str, line: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let at = line
        .checked_sub(1)
        .and_then(|i| lines.get(i))
        .map(|l| l.trim());
    if let Some(header) = at.filter(|l| l.starts_with('[')) {
        // A table header (a second `[params]`): the table is the field.
        let name = header.split(']').next().unwrap_or_default();
        return name.trim_start_matches('[').trim().to_owned();
    }
    let Some(key) = line
        .checked_sub(1)
        .and_then(|i| lines.get(i))
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim())
        .filter(|k| !k.is_empty() && !k.starts_with('['))
    else {
        return String::new();
    };
    let table = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']'));
    match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_owned(),
    }
}

/// The line of the `n`-th (0-based) `[[table]]` header.
fn line_of_table(text: &str, table: &str, n: usize) -> usize {
    table_lines(text, table).get(n).copied().unwrap_or(0)
}

/// The 1-based lines of every `[[table]]` header, in order (TOML allows
/// `[[ table ]]` and a comment after it).
fn table_lines(text: &str, table: &str) -> Vec<usize> {
    let header = format!("[[{table}]]");
    text.lines()
        .enumerate()
        .filter(|(_, l)| header_of(l) == header)
        .map(|(i, _)| i + 1)
        .collect()
}

/// A line as a table header would read without its comment and spaces.
fn header_of(line: &str) -> String {
    let code = line.split('#').next().unwrap_or_default();
    code.chars().filter(|c| !c.is_whitespace()).collect()
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let file = path.display().to_string();
        let text = crate::files::read_text(path, MAX_SCENARIO_BYTES, "MAX_SCENARIO_BYTES")
            .map_err(|e| ScenarioError {
                file: file.clone(),
                line: 0,
                field: "file".into(),
                detail: format!("cannot read it: {e}"),
            })?;
        Self::parse(&file, &text)
    }

    /// Parses and validates scenario text (`file` names it in errors).
    pub fn parse(file: &str, text: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |sp| {
                text[..sp.start.min(text.len())].matches('\n').count() + 1
            });
            let msg = e.message().to_owned();
            let field = msg
                .split('`')
                .nth(1)
                .filter(|_| msg.contains("unknown field") || msg.contains("missing field"))
                .map_or_else(|| key_at(text, line), str::to_owned);
            ScenarioError {
                file: file.to_owned(),
                line,
                field,
                detail: msg,
            }
        })?;
        let mut s = s;
        s.resolve_params(file, text)?;
        s.validate(file, text)?;
        Ok(s)
    }

    /// Builds `params` from the preset and `[params]`, and refuses a
    /// parameter the scenario's model does not use (it would change nothing).
    fn resolve_params(&mut self, file: &str, text: &str) -> Result<(), ScenarioError> {
        let params_at = text
            .lines()
            .position(|l| header_of(l) == "[params]")
            .map_or(0, |i| i + 1);
        let err = |field: &str, detail: String| ScenarioError {
            file: file.to_owned(),
            line: line_in_table(text, field.split('[').next().unwrap_or(field), params_at),
            field: format!("params.{field}"),
            detail,
        };
        let base = self
            .preset
            .map_or_else(Params::default, |p| Params::default().with_preset(p));
        self.params = base.patched(&self.patch).map_err(|e| {
            err(
                e.field,
                format!("{} is not allowed: {}", e.value, e.allowed),
            )
        })?;
        if let Some(field) = unused_under(self.params.model, &self.patch) {
            return Err(err(field, model_detail(field, self.params.model)));
        }
        Ok(())
    }

    fn validate(&self, file: &str, text: &str) -> Result<(), ScenarioError> {
        let err = |field: &str, line: usize, detail: String| ScenarioError {
            file: file.to_owned(),
            line,
            field: field.to_owned(),
            detail,
        };
        if let Err(e) = self
            .swarm
            .validate()
            .and_then(|()| self.swarm.validate_for(self.population))
        {
            return Err(err(
                &format!("swarm.{}", e.field),
                line_of(text, e.field, 0),
                format!("{}: allowed {}", e.value, e.allowed),
            ));
        }
        if self.population > MAX_POPULATION {
            return Err(err(
                "population",
                line_of(text, "population", 0),
                format!(
                    "{} is too many: allowed 0 ..= {MAX_POPULATION}",
                    self.population
                ),
            ));
        }
        if !(1..=10_000_000).contains(&self.ticks) {
            return Err(err(
                "ticks",
                line_of(text, "ticks", 0),
                format!("{}: allowed 1 ..= 10000000", self.ticks),
            ));
        }
        if !(1..=100_000).contains(&self.output.metrics_every) {
            return Err(err(
                "output.metrics_every",
                line_of(text, "metrics_every", 0),
                format!("{}: allowed 1 ..= 100000", self.output.metrics_every),
            ));
        }
        if self.output.trajectories_every > 100_000 {
            return Err(err(
                "output.trajectories_every",
                line_of(text, "trajectories_every", 0),
                format!("{}: allowed 0 ..= 100000", self.output.trajectories_every),
            ));
        }
        // Each event's header line, found once (a search per event made a
        // file of 20,000 events take 10 s to load).
        let event_lines = table_lines(text, "events");
        let event_line = |k: usize| event_lines.get(k).copied().unwrap_or(0);
        if self.events.len() > MAX_EVENTS {
            return Err(err(
                "events",
                event_line(MAX_EVENTS),
                format!(
                    "{} events: allowed at most {MAX_EVENTS} (MAX_EVENTS)",
                    self.events.len()
                ),
            ));
        }
        for (k, e) in self.events.iter().enumerate() {
            let at = event_line(k);
            let actions = [
                e.patch_params.is_some(),
                e.kill_count.is_some(),
                e.kill_fraction.is_some(),
                e.freeze_count.is_some(),
                e.freeze_fraction.is_some(),
                e.thaw.is_some(),
                e.add_predator.is_some(),
                e.add_obstacle.is_some(),
                e.add_goal.is_some(),
                e.remove_agent.is_some(),
            ]
            .iter()
            .filter(|&&a| a)
            .count();
            if actions != 1 {
                return Err(err(
                    &format!("events[{k}]"),
                    at,
                    format!(
                        "{actions} actions: give exactly one of patch_params, kill_count, kill_fraction, freeze_count, freeze_fraction, thaw, add_predator, add_obstacle, add_goal, remove_agent"
                    ),
                ));
            }
            match (e.at_tick, e.at_s) {
                (Some(_), None) => {}
                (None, Some(s)) if s.is_finite() && s >= 0.0 => {}
                _ => {
                    return Err(err(
                        &format!("events[{k}].at_tick"),
                        at,
                        "give exactly one of at_tick and a finite at_s >= 0".into(),
                    ));
                }
            }
            for (name, frac) in [
                ("kill_fraction", e.kill_fraction),
                ("freeze_fraction", e.freeze_fraction),
            ] {
                if let Some(f) = frac
                    && !(f.is_finite() && (0.0..=1.0).contains(&f))
                {
                    return Err(err(
                        &format!("events[{k}].{name}"),
                        line_of(text, name, at),
                        format!("{f}: allowed 0 ..= 1"),
                    ));
                }
            }
            for (name, count) in [
                ("kill_count", e.kill_count),
                ("freeze_count", e.freeze_count),
            ] {
                if let Some(n) = count
                    && n > self.population
                {
                    return Err(err(
                        &format!("events[{k}].{name}"),
                        line_of(text, name, at),
                        format!("{n}: allowed 0 ..= {} (the population)", self.population),
                    ));
                }
            }
            if e.thaw == Some(false) {
                return Err(err(
                    &format!("events[{k}].thaw"),
                    line_of(text, "thaw", at),
                    "false: allowed true (thaw every frozen boid)".into(),
                ));
            }
        }
        // The events in the order they happen (file order within a tick).
        let mut order: Vec<usize> = (0..self.events.len()).collect();
        order.sort_by_key(|&k| self.event_tick(&self.events[k]));
        // Parameter patches in that order, each against the parameters in
        // force then: an earlier event may have changed the model.
        let mut live = self.params;
        for &k in &order {
            let Some(p) = &self.events[k].patch_params else {
                continue;
            };
            let at = event_line(k);
            if p.tick_hz.is_some() {
                // The run's clock (`at_s`, `time_s`, `--until-seconds`,
                // `simulated_s`) counts in one rate.
                return Err(err(
                    &format!("events[{k}].patch_params.tick_hz"),
                    line_in_table(text, "tick_hz", at),
                    "allowed only in [params]: a run keeps one tick rate, which its times (at_s, time_s, --until-seconds) count in".into(),
                ));
            }
            let patched = live.patched(p).map_err(|pe| {
                err(
                    &format!("events[{k}].patch_params.{}", pe.field),
                    line_in_table(text, pe.field, at),
                    format!("{}: allowed {}", pe.value, pe.allowed),
                )
            })?;
            if let Some(field) = unused_under(patched.model, p) {
                return Err(err(
                    &format!("events[{k}].patch_params.{field}"),
                    line_in_table(text, field, at),
                    model_detail(field, patched.model),
                ));
            }
            live = patched;
        }
        // Agents are validated by building the flock once (cheaply, without boids).
        let mut probe = self.build_with(0).map_err(|(field, detail)| {
            let (table, idx) = field
                .split_once('[')
                .map_or((field.as_str(), 0), |(t, rest)| {
                    (t, rest.trim_end_matches(']').parse().unwrap_or(0))
                });
            // A table of tables (`[[obstacles]]`), a table (`[placement]`),
            // else a key (`placement = `).
            let header = format!("[{table}]");
            let line = match line_of_table(text, table, idx) {
                0 => text
                    .lines()
                    .position(|l| header_of(l) == header)
                    .map_or_else(|| line_of(text, table, 0), |i| i + 1),
                n => n,
            };
            err(&field, line, detail)
        })?;
        // Agent events are tried on the probe flock too, in the order they
        // happen: an added agent either applies anywhere or nowhere (caps
        // aside), and an agent removed must have been added by then (ids
        // are given in order) and not have run out of time. The probe stays
        // at tick 0, so the expiry it gives an agent counts from the event
        // that added it; parameter patches go to it too (agents are
        // checked against the parameters in force).
        let mut expires: HashMap<u32, u64> = expiries(&probe)
            .filter_map(|(id, end)| Some((id, end?)))
            .collect();
        for k in order {
            let e = &self.events[k];
            let at = self.event_tick(e);
            let fail = |d: String| err(&format!("events[{k}]"), event_line(k), d);
            if let Some(id) = e.remove_agent
                && let Some(&end) = expires.get(&id)
                && end < at
            {
                // Dropped by the step at its expiry tick, so gone from the
                // events of every tick after it.
                return Err(fail(format!(
                    "remove_agent = {id}: its time to live ran out at tick {end}, before this event's tick {at} (allowed: an agent still there at the event's tick)"
                )));
            }
            let agent =
                e.add_obstacle.is_some() || e.add_goal.is_some() || e.add_predator.is_some();
            if agent || e.remove_agent.is_some() || e.patch_params.is_some() {
                let added = e
                    .op(0, 0)
                    .and_then(|(op, _)| apply_op(&mut probe, op))
                    .map_err(|d| fail(d.to_string()))?;
                if let Some(id) = added.filter(|_| agent)
                    && let Some((_, Some(end))) = expiries(&probe).find(|&(i, _)| i == id)
                {
                    expires.insert(id, at + end);
                }
            }
        }
        Ok(())
    }

    /// The tick an event happens at.
    pub fn event_tick(&self, e: &Event) -> u64 {
        e.at_tick.unwrap_or_else(|| {
            (e.at_s.unwrap_or(0.0) * f64::from(self.params.tick_hz)).round() as u64
        })
    }

    /// The flock at tick 0 with `seed`.
    pub fn build(&self, seed: u64) -> Result<Flock, ScenarioError> {
        let mut s = self.clone();
        s.seed = seed;
        s.build_with(self.population)
            .map_err(|(field, detail)| ScenarioError {
                file: self.name.clone(),
                line: 0,
                field,
                detail,
            })
    }

    fn build_with(&self, population: usize) -> Result<Flock, (String, String)> {
        let uniform = matches!(self.placement, Placement::Uniform);
        let mut f = Flock::new(FlockConfig {
            params: self.params,
            population: if uniform { population } else { 0 },
            seed: self.seed,
        })
        .map_err(|e| ("params".to_owned(), e.to_string()))?;
        if let Placement::Ball { center, radius_m } = self.placement {
            f.spawn_boids(Vec3::from(center), radius_m, population)
                .map_err(|e| ("placement".to_owned(), e.to_string()))?;
        }
        for (k, o) in self.obstacles.iter().enumerate() {
            o.op()
                .and_then(|op| apply_op(&mut f, op))
                .map_err(|e| (format!("obstacles[{k}]"), e.to_string()))?;
        }
        for (k, g) in self.goals.iter().enumerate() {
            g.op()
                .and_then(|op| apply_op(&mut f, op))
                .map_err(|e| (format!("goals[{k}]"), e.to_string()))?;
        }
        for (k, p) in self.predators.iter().enumerate() {
            apply_op(&mut f, p.op()).map_err(|e| (format!("predators[{k}]"), e.to_string()))?;
        }
        Ok(f)
    }
}

/// The first parameter `patch` sets that `model` does not use.
fn unused_under(model: Model, patch: &ParamsPatch) -> Option<&'static str> {
    let set = serde_json::to_value(patch).unwrap_or_default();
    SPECS
        .iter()
        .filter(|s| !s.models.contains(model))
        .map(|s| s.name)
        .find(|name| set.get(name).is_some_and(|v| !v.is_null()))
}

/// Why a parameter is refused under `model`, naming the models that use it.
fn model_detail(field: &str, model: Model) -> String {
    let users = used_only_by(field, model).unwrap_or_default();
    format!(
        "is used only by model {users} and this scenario's model is {model}: remove it or set model"
    )
}

/// A count an event asked for that the flock could not give in full: the
/// event applied to all there were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Capped {
    /// The event's field (`kill_count`, `freeze_count`, `freeze_fraction`).
    pub field: &'static str,
    /// Boids it asked for.
    pub asked: usize,
    /// Boids it applied to (all that were alive, or not yet frozen).
    pub applied: usize,
}

impl Event {
    /// The op this event performs on a flock of `alive` boids of which
    /// `frozen` are frozen (validated events have exactly one action), and
    /// the count it had to cut, if any. A fraction stays a fraction (it is
    /// resolved against the boids alive when it applies) unless the boids
    /// it amounts to are more than are left.
    pub fn op(&self, alive: usize, frozen: usize) -> Result<(Op, Option<Capped>), OpError> {
        let unfrozen = alive - frozen.min(alive);
        let cap = |field: &'static str, amount: Amount, max: usize| {
            let asked = amount.resolve(alive);
            if asked <= max {
                return (amount, None);
            }
            let capped = Capped {
                field,
                asked,
                applied: max,
            };
            (Amount::Count(max), Some(capped))
        };
        let freeze = |(amount, capped): (Amount, _)| {
            let which = match amount {
                Amount::Count(n) => Selection::Count(n),
                Amount::Fraction(f) => Selection::Fraction(f),
            };
            Ok((Op::FreezeBoids(which), capped))
        };
        let kill = |(amount, capped)| Ok((Op::KillBoids(amount), capped));
        if let Some(n) = self.freeze_count {
            return freeze(cap("freeze_count", Amount::Count(n), unfrozen));
        }
        if let Some(f) = self.freeze_fraction {
            return freeze(cap("freeze_fraction", Amount::Fraction(f), unfrozen));
        }
        if let Some(n) = self.kill_count {
            return kill(cap("kill_count", Amount::Count(n), alive));
        }
        if let Some(f) = self.kill_fraction {
            return kill(cap("kill_fraction", Amount::Fraction(f), alive));
        }
        self.other_op().map(|op| (op, None))
    }

    /// The op of an event that acts on no count of boids.
    fn other_op(&self) -> Result<Op, OpError> {
        if self.thaw == Some(true) {
            return Ok(Op::Thaw { ids: None });
        }
        if let Some(p) = &self.patch_params {
            return Ok(Op::PatchParams(Box::new(*p)));
        }
        if let Some(p) = &self.add_predator {
            return Ok(p.op());
        }
        if let Some(o) = &self.add_obstacle {
            return o.op();
        }
        if let Some(g) = &self.add_goal {
            return g.op();
        }
        if let Some(id) = self.remove_agent {
            return Ok(Op::RemoveAgent { id });
        }
        Err(OpError::BadInput {
            field: None,
            detail: "no action".into(),
        })
    }
}

/// Each agent's id and the tick its time to live runs out at, if it has one.
fn expiries(f: &Flock) -> impl Iterator<Item = (u32, Option<u64>)> + '_ {
    let a = f.agents();
    let obstacles = a.obstacles().iter().map(|o| (o.id, o.expires_at_tick));
    let goals = a.goals().iter().map(|g| (g.id, g.expires_at_tick));
    let predators = a.predators().iter().map(|p| (p.id, p.expires_at_tick));
    obstacles.chain(goals).chain(predators)
}

/// Applies an op outside the server (building a scenario, headless events).
pub fn apply_op(f: &mut Flock, op: Op) -> Result<Option<u32>, OpError> {
    let mut paused = false;
    crate::command::apply(f, &mut paused, op, |f| f.step()).map(|a| a.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_errors_name_the_line_and_the_field() {
        // An unknown model lists the allowed ones.
        let text = "population = 10\n[params]\nmodel = \"boids\"\n";
        check(text, 3, "params.model");
        let e = Scenario::parse("s.toml", text).unwrap_err();
        assert!(e.detail.contains("olfati_saber"), "{e}");
        // A Vásárhelyi parameter under the default (Reynolds) model.
        check(
            "population = 10\n[params]\nw_sep = 2.0\nvas_rep_gain = 0.1\n",
            4,
            "params.vas_rep_gain",
        );
        let e = Scenario::parse("s.toml", "[params]\nos_b = 2\n").unwrap_err();
        assert!(
            e.detail.contains("olfati_saber") && e.detail.contains("reynolds"),
            "{e}"
        );
        // A Reynolds weight under a drone model.
        check(
            "preset = \"olfati-saber\"\n[params]\nw_coh = 1\n",
            3,
            "params.w_coh",
        );
        // Out of range under its own model: a above b.
        check(
            "[params]\nmodel = \"olfati_saber\"\nos_a = 6\n",
            3,
            "params.os_a",
        );
        // An event patching a parameter its model does not use.
        check(
            "preset = \"vasarhelyi\"\nticks = 10\n\n[[events]]\nat_tick = 5\npatch_params = { os_c_vm = 2 }\n",
            6,
            "events[0].patch_params.os_c_vm",
        );
        // An event switching the model makes the next one's terms valid,
        // whatever the file order, and a Reynolds weight after it invalid.
        let switch = "ticks = 10\n\n[[events]]\nat_tick = 6\npatch_params = { os_c_vm = 2 }\n\n[[events]]\nat_tick = 5\npatch_params = { model = \"olfati_saber\" }\n";
        Scenario::parse("s.toml", switch).unwrap();
        check(
            &format!("{switch}\n[[events]]\nat_tick = 7\npatch_params = {{ w_sep = 1 }}\n"),
            13,
            "events[2].patch_params.w_sep",
        );
        // Fine: the preset's model with its own parameters over it.
        let s = Scenario::parse(
            "s.toml",
            "preset = \"vasarhelyi\"\n[params]\nvas_rep_gain = 0.05\nd_ref_m = 10\n",
        )
        .unwrap();
        assert_eq!(s.params.model, Model::Vasarhelyi);
        assert_eq!((s.params.vas_rep_gain, s.params.d_ref_m), (0.05, 10.0));
        assert_eq!(s.params.k_nearest, 10, "the rest from the preset");
        // The shipped SwarmLab scenarios load.
        for f in ["swarmlab-vasarhelyi", "swarmlab-olfati-saber"] {
            let path = format!("{}/../../scenarios/{f}.toml", env!("CARGO_MANIFEST_DIR"));
            Scenario::load(Path::new(&path)).unwrap();
        }
    }

    fn check(text: &str, line: usize, field: &str) {
        let e = Scenario::parse("s.toml", text).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
        assert!(e.to_string().starts_with(&format!("s.toml:{line}:")), "{e}");
    }

    fn event(text: &str) -> Event {
        let s = Scenario::parse("s.toml", &format!("[[events]]\nat_tick = 1\n{text}\n")).unwrap();
        s.events[0].clone()
    }

    #[test]
    fn counts_are_cut_to_the_boids_there_are_and_say_so() {
        let (op, cut) = event("kill_count = 30").op(20, 0).unwrap();
        assert!(matches!(op, Op::KillBoids(Amount::Count(20))), "{op:?}");
        let want = Capped {
            field: "kill_count",
            asked: 30,
            applied: 20,
        };
        assert_eq!(cut, Some(want));
        let (op, cut) = event("kill_count = 20").op(20, 0).unwrap();
        assert!(matches!(op, Op::KillBoids(Amount::Count(20))) && cut.is_none());
        // Half of 100 frozen: 0.8 of the alive is more than are left.
        let (op, cut) = event("freeze_fraction = 0.8").op(100, 50).unwrap();
        assert!(
            matches!(op, Op::FreezeBoids(Selection::Count(50))),
            "{op:?}"
        );
        assert_eq!(
            cut.map(|c| (c.field, c.asked)),
            Some(("freeze_fraction", 80))
        );
        let (op, cut) = event("freeze_count = 7").op(100, 90).unwrap();
        assert!(matches!(op, Op::FreezeBoids(Selection::Count(7))) && cut.is_none());
        let (op, cut) = event("kill_fraction = 1.0").op(33, 0).unwrap();
        assert!(cut.is_none());
        // A fraction that fits stays a fraction, resolved when it applies.
        assert!(
            matches!(op, Op::KillBoids(Amount::Fraction(f)) if f == 1.0),
            "{op:?}"
        );
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        check("seed = 3\nbogus = 1\n", 2, "bogus");
        check(
            "population = 10\n[params]\nw_sep = 2\nfov_deg = 720\n",
            4,
            "params.fov_deg",
        );
        check("[output]\nmetrics_every = 0\n", 2, "output.metrics_every");
        check(
            "[[obstacles]]\nsphere = { center = [1, 2, 3], radius_m = 5 }\n[[obstacles]]\nsphere = { center = [1, 2, 3], radius_m = -5 }\n",
            3,
            "obstacles[1]",
        );
        check(
            "[[events]]\nat_tick = 5\nkill_fraction = 1.5\n",
            3,
            "events[0].kill_fraction",
        );
        check(
            "population = 9\n[[events]]\nat_tick = 5\nfreeze_count = 10\n",
            4,
            "events[0].freeze_count",
        );
        check(
            "[[events]]\nat_tick = 5\nfreeze_fraction = -0.1\n",
            3,
            "events[0].freeze_fraction",
        );
        check(
            "[[events]]\nat_tick = 5\nthaw = false\n",
            3,
            "events[0].thaw",
        );
        check(
            "[[events]]\nat_tick = 5\n[events.patch_params]\nlatency_ticks = 500\n",
            4,
            "events[0].patch_params.latency_ticks",
        );
        check("[[events]]\nat_tick = 5\n", 1, "events[0]");
        check(
            "[[events]]\nat_s = 1.0\n[events.patch_params]\nw_ali = -1\n",
            4,
            "events[0].patch_params.w_ali",
        );
        check("ticks = \"many\"\n", 1, "ticks");
        check("[params]\nw_sep = 1\n[params]\nw_ali = 1\n", 3, "params");
        check(
            "population = 10\nplacement = { kind = \"ball\", center = [1, 2, 3], radius_m = -5 }\n",
            2,
            "placement",
        );
        // The same as a table (it was line 0).
        check(
            "population = 10\n[placement]\nkind = \"ball\"\ncenter = [1, 2, 3]\nradius_m = -5\n",
            2,
            "placement",
        );
        // A rule between two parameters names the one the file did not set:
        // the line is the table's, not a later event's that sets it.
        check(
            "[params]\nmax_speed_mps = 2\n[[events]]\nat_tick = 5\npatch_params = { min_speed_mps = 1 }\n",
            1,
            "params.min_speed_mps",
        );
        // An agent removed before it is added, or never added: found at
        // load, not after the run got there.
        let add = "[[events]]\nat_tick = 20\nadd_obstacle = { sphere = { center = [1, 2, 3], radius_m = 5 } }\n";
        check(
            &format!("{add}[[events]]\nat_tick = 10\nremove_agent = 0\n"),
            4,
            "events[1]",
        );
        check(
            "[[events]]\nat_tick = 10\nremove_agent = 42\n",
            1,
            "events[0]",
        );
        // One whose time to live (15 ticks at 60 Hz) ran out: it is there
        // for the events of its last tick, 35, and gone after.
        let brief = "[[events]]\nat_tick = 20\nadd_obstacle = { sphere = { center = [1, 2, 3], radius_m = 5 }, ttl_s = 0.25 }\n";
        check(
            &format!("{brief}[[events]]\nat_tick = 36\nremove_agent = 0\n"),
            4,
            "events[1]",
        );
        let e = Scenario::parse(
            "s.toml",
            &format!("{brief}[[events]]\nat_tick = 36\nremove_agent = 0\n"),
        )
        .unwrap_err();
        assert!(e.detail.contains("ran out at tick 35"), "{e}");
        Scenario::parse(
            "s.toml",
            &format!("{brief}[[events]]\nat_tick = 35\nremove_agent = 0\n"),
        )
        .unwrap();
        // A rule between two parameters, broken by a patch that names only
        // one of them: the event's line (it was 0).
        check(
            "seed = 1\n[[events]]\nat_tick = 5\npatch_params = { world_m = [1, 1, 1] }\n",
            2,
            "events[0].patch_params.edge_margin_m",
        );
        // A run keeps one tick rate: its times count in it.
        check(
            "[[events]]\nat_tick = 5\npatch_params = { tick_hz = 30 }\n",
            3,
            "events[0].patch_params.tick_hz",
        );
        // Agents of the file's tables count from tick 0.
        check(
            "[[obstacles]]\nsphere = { center = [1, 2, 3], radius_m = 5 }\nttl_s = 1\n[[events]]\nat_tick = 61\nremove_agent = 0\n",
            4,
            "events[0]",
        );
        Scenario::parse(
            "s.toml",
            &format!("{add}[[events]]\nat_tick = 30\nremove_agent = 0\n"),
        )
        .unwrap();
    }

    /// At most `MAX_EVENTS` events, the first one over named by its line;
    /// that many load (each header is found once, not searched for per
    /// event: 20,000 took 10 s).
    #[test]
    fn events_are_capped_and_named_by_line() {
        let events = |n: usize| "[[ events ]] # a drill\nat_tick = 5\nthaw = true\n".repeat(n);
        let s = Scenario::parse("s.toml", &events(MAX_EVENTS)).unwrap();
        assert_eq!(s.events.len(), MAX_EVENTS);
        check(&events(MAX_EVENTS + 1), 3 * MAX_EVENTS + 1, "events");
        let e = Scenario::parse("s.toml", &events(MAX_EVENTS + 1)).unwrap_err();
        assert!(e.detail.contains("MAX_EVENTS"), "{e}");
    }

    #[test]
    fn a_full_scenario_parses() {
        let s = Scenario::parse(
            "s.toml",
            r#"
name = "demo"
seed = 7
population = 200
ticks = 120
[placement]
kind = "ball"
center = [50, 50, 20]
radius_m = 10
[params]
world_m = [100, 100, 40]
[output]
trajectories_every = 10
[[obstacles]]
box = { min = [10, 10, 10], max = [20, 20, 20] }
[[goals]]
waypoints = [[20, 20, 20], [80, 80, 20]]
looping = true
[[predators]]
mode = "hunter"
position = [5, 5, 5]
[[events]]
at_s = 1.0
kill_fraction = 0.1
"#,
        )
        .unwrap();
        assert_eq!(s.event_tick(&s.events[0]), 60);
        let f = s.build(7).unwrap();
        assert_eq!(f.len(), 200);
        assert_eq!(f.agents().obstacles().len(), 1);
        assert!(
            f.boids()
                .iter()
                .all(|b| (b.p - Vec3::new(50.0, 50.0, 20.0)).length() <= 10.0 + 1e-3)
        );
    }
}
