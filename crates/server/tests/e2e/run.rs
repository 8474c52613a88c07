//! `starling run`: scenario files headless, through the real binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("starling-run-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn starling(args: &[&str], threads: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_starling"))
        .args(args)
        .env("RAYON_NUM_THREADS", threads)
        .output()
        .unwrap()
}

const SCENARIO: &str = r#"
name = "test"
seed = 5
population = 300
ticks = 240
[params]
world_m = [60, 60, 30]
[output]
metrics_every = 5
trajectories_every = 60
[[obstacles]]
sphere = { center = [30, 30, 15], radius_m = 5 }
[[goals]]
position = [10, 10, 15]
[[events]]
at_s = 2.0
kill_count = 30
"#;

/// `command`'s output once it exits, which a refusal does at once; past a
/// bound on a hang (a run or server that started), it is killed and the
/// test fails with `started`. Not a timing: the refusal takes milliseconds.
fn refused_within(command: &mut Command, started: &str) -> std::process::Output {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{started}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn write(dir: &Path, text: &str) -> String {
    let p = dir.join("s.toml");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn a_scenario_runs_headless_and_writes_the_documented_files() {
    let dir = scratch("files");
    let scenario = write(&dir, SCENARIO);
    let out = dir.join("out");
    let r = starling(&["run", &scenario, "--out", out.to_str().unwrap()], "2");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let metrics = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    let mut lines = metrics.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("tick,time_s,population,order")
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 240 / 5);
    // The kill at 2 s (tick 120) shows in population.
    let n_at = |tick: &str| {
        rows.iter()
            .find(|r| r.starts_with(&format!("{tick},")))
            .unwrap()
            .split(',')
            .nth(2)
            .unwrap()
            .to_owned()
    };
    assert_eq!(n_at("115"), "300");
    assert_eq!(n_at("125"), "270");
    // Obstacle clearance and goal distance are filled in.
    assert!(
        rows[0].split(',').nth(11).is_some_and(|c| !c.is_empty()),
        "{}",
        rows[0]
    );
    let traj = std::fs::read_to_string(out.join("trajectories.csv")).unwrap();
    assert_eq!(traj.lines().count(), 1 + 300 + 300 + 270 + 270);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["ticks"], 240);
    assert_eq!(summary["events_applied"], 1);
    assert!(summary["ticks_per_s"].as_f64().unwrap() > 0.0);
    assert!(!dir.join("out.partial").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_same_seed_gives_byte_identical_outputs_on_one_and_two_threads() {
    let dir = scratch("threads");
    let scenario = write(&dir, SCENARIO);
    let (a, b) = (dir.join("one"), dir.join("two"));
    assert!(
        starling(&["run", &scenario, "--out", a.to_str().unwrap()], "1")
            .status
            .success()
    );
    assert!(
        starling(&["run", &scenario, "--out", b.to_str().unwrap()], "2")
            .status
            .success()
    );
    for f in ["metrics.csv", "trajectories.csv"] {
        assert!(
            std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(),
            "{f} differs"
        );
    }
    // A different seed gives a different run.
    let c = dir.join("other");
    assert!(
        starling(
            &[
                "run",
                &scenario,
                "--seeds",
                "6",
                "--out",
                c.to_str().unwrap()
            ],
            "2"
        )
        .status
        .success()
    );
    assert!(
        std::fs::read(a.join("metrics.csv")).unwrap()
            != std::fs::read(c.join("metrics.csv")).unwrap()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn seed_batches_summarise_mean_and_spread() {
    let dir = scratch("batch");
    let scenario = write(&dir, SCENARIO);
    let out = dir.join("batch");
    let r = starling(
        &[
            "run",
            &scenario,
            "--seeds",
            "1..3",
            "--ticks",
            "60",
            "--out",
            out.to_str().unwrap(),
        ],
        "2",
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    for seed in 1..=3 {
        assert!(out.join(format!("seed-{seed}/metrics.csv")).exists());
    }
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["seeds"], serde_json::json!([1, 2, 3]));
    assert_eq!(s["runs"].as_array().unwrap().len(), 3);
    let fo = &s["final_order"];
    assert!(
        fo["min"].as_f64().unwrap() <= fo["mean"].as_f64().unwrap()
            && fo["mean"].as_f64().unwrap() <= fo["max"].as_f64().unwrap()
    );
    assert!(
        fo["std"].as_f64().unwrap() > 0.0,
        "three seeds differ: {fo}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An event that asks for more boids than earlier events left applies to
/// all there are, and says so: on stderr and in `summary.json`.
#[test]
fn events_cut_to_the_boids_left_are_reported() {
    let dir = scratch("capped");
    let scenario = write(
        &dir,
        "population = 300\nticks = 20\n[[events]]\nat_tick = 5\nkill_count = 200\n[[events]]\nat_tick = 10\nkill_count = 150\n",
    );
    let out = dir.join("out");
    let r = starling(&["run", &scenario, "--out", out.to_str().unwrap()], "2");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("event 1 at tick 10: kill_count asked for 150 boids, 100 there were"),
        "{err}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["events_applied"], 2);
    assert_eq!(
        summary["events_capped"],
        serde_json::json!([
            {"event": 1, "tick": 10, "field": "kill_count", "asked": 150, "applied": 100}
        ])
    );
    assert_eq!(summary["last_tick"]["population"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_scenarios_name_the_line_and_field_and_write_nothing() {
    let dir = scratch("bad");
    for (text, want) in [
        (
            "population = 10\n[params]\nw_sep = 1\nmax_speed_mps = -3\n",
            ":4: `params.max_speed_mps`",
        ),
        ("population = 10\nspeed = 3\n", ":2: `speed`"),
        (
            "[[events]]\nat_tick = 3\nkill_fraction = 2\n",
            ":3: `events[0].kill_fraction`",
        ),
        (
            "population = 50\n[[events]]\nat_tick = 3\nkill_count = 51\n",
            ":4: `events[0].kill_count`",
        ),
    ] {
        let scenario = write(&dir, text);
        let out = dir.join("never");
        let r = starling(&["run", &scenario, "--out", out.to_str().unwrap()], "2");
        assert!(!r.status.success());
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(err.contains(&format!("s.toml{want}")), "{err}");
        assert!(!out.exists() && !dir.join("never.partial").exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_mcap_path_fails_before_the_run_and_writes_nothing() {
    let dir = scratch("mcap-bad");
    // Ten million ticks run for many minutes: the refusal must come first.
    let long = SCENARIO.replace("ticks = 240", "ticks = 10000000");
    assert_ne!(long, SCENARIO);
    let scenario = write(&dir, &long);
    let mcap = dir.join("no-such-dir").join("run.mcap");
    let out = dir.join("never");
    let r = refused_within(
        Command::new(env!("CARGO_BIN_EXE_starling")).args([
            "run",
            &scenario,
            "--out",
            out.to_str().unwrap(),
            "--mcap",
            mcap.to_str().unwrap(),
        ]),
        "the run started before the MCAP path was refused",
    );
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains(mcap.to_str().unwrap()),
        "names the path: {err}"
    );
    assert!(!out.exists() && !dir.join("never.partial").exists());
    assert!(!mcap.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_example_scenarios_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "toml") {
            starling_server::lab::scenario::Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 3);
}

#[test]
fn a_recorded_headless_run_replays() {
    let dir = scratch("record");
    let scenario = write(&dir, SCENARIO);
    let rec = dir.join("run.jsonl");
    let out = dir.join("out");
    let (run_mcap, replay_mcap) = (dir.join("run.mcap"), dir.join("replay.mcap"));
    let r = starling(
        &[
            "run",
            &scenario,
            "--out",
            out.to_str().unwrap(),
            "--record",
            rec.to_str().unwrap(),
            "--mcap",
            run_mcap.to_str().unwrap(),
        ],
        "2",
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let r = starling(&["replay", rec.to_str().unwrap()], "1");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let report: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(report["ops"], 1, "the kill event");
    assert_eq!(report["final_tick"], 240);
    assert!(report["digests_checked"].as_u64().unwrap() >= 4);
    // The replay's export is the run's: the same samples, stamped alike,
    // from the start state on (it began a tick late, 1/60 s early).
    let r = starling(
        &[
            "replay",
            rec.to_str().unwrap(),
            "--mcap",
            replay_mcap.to_str().unwrap(),
        ],
        "1",
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let messages = |path: &std::path::Path| {
        let bytes = std::fs::read(path).unwrap();
        mcap::MessageStream::new(&bytes)
            .unwrap()
            .map(|m| {
                let m = m.unwrap();
                let mut data = m.data.into_owned();
                if m.channel.topic == "/metrics" {
                    // The step's wall-clock time is the one thing of the
                    // machine's in a sample.
                    let mut v: serde_json::Value = serde_json::from_slice(&data).unwrap();
                    v["tick"]["step_ms"] = serde_json::Value::Null;
                    data = serde_json::to_vec(&v).unwrap();
                }
                (m.channel.topic.clone(), m.log_time, data)
            })
            .collect::<Vec<_>>()
    };
    let (run, replayed) = (messages(&run_mcap), messages(&replay_mcap));
    assert_eq!(run.len(), replayed.len());
    for (a, b) in run.iter().zip(&replayed) {
        assert!(
            a == b,
            "{} at {} ns differs from the replay's {} at {} ns: {} / {}",
            a.0,
            a.1,
            b.0,
            b.1,
            String::from_utf8_lossy(&a.2),
            String::from_utf8_lossy(&b.2)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run never writes over anything, and a run that fails leaves no
/// output that looks finished (found by an audit: `--record` replaced the
/// scenario file; a second seed batch overwrote a folder's summary; a
/// failed run left a recording that replayed as whole).
#[test]
fn a_run_never_overwrites_and_a_failed_run_leaves_nothing() {
    let dir = scratch("overwrite");
    let scenario = write(&dir, SCENARIO);
    let before = std::fs::read_to_string(&scenario).unwrap();
    let out = dir.join("out").to_str().unwrap().to_owned();
    let r = starling(
        &["run", &scenario, "--out", &out, "--record", &scenario],
        "2",
    );
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("--record") && err.contains("never overwrites"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&scenario).unwrap(), before);
    // A batch into a folder that exists, and into one that does not.
    std::fs::create_dir_all(dir.join("kept")).unwrap();
    std::fs::write(dir.join("kept/summary.json"), "mine").unwrap();
    let kept = dir.join("kept").to_str().unwrap().to_owned();
    let r = starling(&["run", &scenario, "--seeds", "1..2", "--out", &kept], "2");
    assert!(!r.status.success());
    assert_eq!(
        std::fs::read_to_string(dir.join("kept/summary.json")).unwrap(),
        "mine"
    );
    let batch = dir.join("batch");
    let r = starling(
        &[
            "run",
            &scenario,
            "--seeds",
            "1..2",
            "--ticks",
            "20",
            "--out",
            batch.to_str().unwrap(),
        ],
        "2",
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    for f in [
        "summary.json",
        "report.html",
        "seed-1/metrics.csv",
        "seed-2/summary.json",
    ] {
        assert!(batch.join(f).exists(), "{f}");
    }
    assert!(!dir.join("batch.partial").exists());
    // A run that fails at tick 2, once it has written: a latency too long
    // for the delay line at this population (checked against the boids,
    // which the load's probe flock does not have).
    let failing = write(
        &dir,
        "population = 280000\nticks = 5\n[[events]]\nat_tick = 2\npatch_params = { latency_ticks = 120 }\n",
    );
    let (rec, mcap) = (dir.join("f.jsonl"), dir.join("f.mcap"));
    let fout = dir.join("fout");
    let r = starling(
        &[
            "run",
            &failing,
            "--out",
            fout.to_str().unwrap(),
            "--record",
            rec.to_str().unwrap(),
            "--mcap",
            mcap.to_str().unwrap(),
        ],
        "2",
    );
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("at tick 2") && err.contains("latency_ticks"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('f'))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `replay --mcap` is put in place only once every digest checked, and
/// never over a file (it turned the recording it replayed into MCAP).
#[test]
fn a_replay_exports_mcap_only_to_a_new_file() {
    let dir = scratch("replay-mcap");
    let scenario = write(&dir, SCENARIO);
    let rec = dir.join("run.jsonl");
    let out = dir.join("out");
    let r = starling(
        &[
            "run",
            &scenario,
            "--ticks",
            "60",
            "--out",
            out.to_str().unwrap(),
            "--record",
            rec.to_str().unwrap(),
        ],
        "2",
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let recorded = std::fs::read(&rec).unwrap();
    let r = starling(
        &[
            "replay",
            rec.to_str().unwrap(),
            "--mcap",
            rec.to_str().unwrap(),
        ],
        "2",
    );
    assert!(!r.status.success());
    assert_eq!(std::fs::read(&rec).unwrap(), recorded);
    let mcap = dir.join("run.mcap");
    let r = starling(
        &[
            "replay",
            rec.to_str().unwrap(),
            "--mcap",
            mcap.to_str().unwrap(),
        ],
        "2",
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(mcap.exists() && !dir.join("run.mcap.partial").exists());
    // A serve flag without --serve would be ignored: refused, named.
    let r = starling(&["replay", rec.to_str().unwrap(), "--population", "5"], "2");
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("--population") && err.contains("only with --serve"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A served session's state file is checked before it starts: one whose
/// directory does not exist is refused at once, naming the setting, and
/// no banner says the flock is served (it was found only at shutdown, and
/// the session lost).
#[test]
fn serve_refuses_a_state_file_it_could_not_write_before_it_starts() {
    let dir = scratch("serve-files");
    let missing = dir.join("no-such-dir").join("flock.json");
    let r = refused_within(
        Command::new(env!("CARGO_BIN_EXE_starling"))
            .args([
                "serve",
                "--population",
                "100",
                "--bind",
                "127.0.0.1:0",
                "--state-file",
            ])
            .arg(&missing),
        "the server started with a state file it cannot write",
    );
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("`state_file`"), "{err}");
    assert!(!String::from_utf8_lossy(&r.stdout).contains("serving"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A config file's flock settings do not apply to a replay (the recording
/// sets the flock) or to an edge (its origin runs it): refused, naming the
/// key and the file, as their flags are (the file's were ignored).
#[test]
fn replays_and_edges_refuse_a_config_files_flock_settings() {
    let dir = scratch("config-flock");
    let config = dir.join("flock.toml");
    std::fs::write(&config, "population = 100000\n[params]\nw_sep = 2.0\n").unwrap();
    let config = config.to_str().unwrap();
    let recording = dir.join("run.jsonl");
    let modes: [&[&str]; 2] = [
        &["replay", recording.to_str().unwrap(), "--serve"],
        &["edge", "--nats", "nats://127.0.0.1:4222"],
    ];
    for (mode, why) in modes.into_iter().zip(["a replay", "an edge"]) {
        let r = refused_within(
            Command::new(env!("CARGO_BIN_EXE_starling"))
                .args(mode)
                .args(["--bind", "127.0.0.1:0", "--config", config]),
            "a server started with a config file's flock settings ignored",
        );
        assert!(!r.status.success());
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(
            err.contains("population (in the config file")
                && err.contains("flock.toml")
                && err.contains(&format!("does not apply to {why}")),
            "{err}"
        );
    }
    // Settings a replay does take are still read from the file.
    std::fs::write(dir.join("flock.toml"), "snapshot_hz = 500\n").unwrap();
    let r = refused_within(
        Command::new(env!("CARGO_BIN_EXE_starling"))
            .args(modes[0])
            .args(["--bind", "127.0.0.1:0", "--config", config]),
        "a replay served with snapshot_hz = 500",
    );
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("snapshot_hz"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
