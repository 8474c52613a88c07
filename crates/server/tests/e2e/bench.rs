//! `starling bench`: what it reports, through the real binary.

use std::process::{Command, Output};

fn starling_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_starling"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap()
}

/// `starling bench ARGS`, which must succeed: its one JSON line.
fn bench_line(args: &[&str]) -> serde_json::Value {
    let out = starling_bench(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A million boids of the default flock fit in 120 MiB (the engine alone,
/// without the server's snapshot encoder: 86-96 MiB; it was 150 MiB while
/// the kernel's output had an array of its own), measured as the process's
/// peak resident memory by the bench line itself.
#[test]
fn a_million_boid_flock_stays_under_120_mib() {
    let line = bench_line(&[
        "--scenario",
        "full",
        "--population",
        "1000000",
        "--threads",
        "2",
        "--ticks",
        "2",
        "--warmup",
        "1",
        "--no-snapshots",
    ]);
    assert_eq!(line["scenario"], "B-full");
    assert!(line.get("snapshot_ms_p50").is_none(), "{line}");
    assert_eq!(line["population"], 1_000_000);
    let peak = line["peak_rss_mib"].as_f64();
    if !cfg!(target_os = "linux") && peak.is_none() {
        return; // no /proc to read
    }
    let peak = peak.unwrap_or_else(|| panic!("no peak_rss_mib on Linux: {line}"));
    assert!(
        peak > 20.0,
        "a million boids cannot fit in {peak} MiB: {line}"
    );
    assert!(peak < 120.0, "peak {peak} MiB for a million boids: {line}");
}

/// Scenario B reports the server's snapshot encoder on the ticks a default
/// server broadcasts, and the whole tick (step plus snapshot) with it.
#[test]
fn scenario_b_reports_the_whole_tick_with_its_snapshot() {
    let b = [
        "--scenario",
        "full",
        "--population",
        "2000",
        "--threads",
        "1",
        "--ticks",
        "8",
        "--warmup",
        "2",
    ];
    let line = bench_line(&b);
    assert_eq!(line["snapshot_hz"], 30, "{line}");
    for key in [
        "snapshot_ms_p50",
        "snapshot_ms_p99",
        "whole_tick_ms_p50",
        "whole_tick_ms_p99",
    ] {
        let ms = line[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {key}: {line}"));
        assert!(ms > 0.0, "{key} = {ms}: {line}");
    }
    assert!(line["whole_tick_ms_p99"].as_f64() > line["snapshot_ms_p99"].as_f64());
    assert_eq!(line["snapshot_cells"], 0, "{line}");
    // With the interest stream's cells, as a server with an interest viewer.
    let cells = bench_line(&[&b[..], &["--cells"]].concat());
    assert!(cells["snapshot_cells"].as_u64() > Some(0), "{cells}");
    assert!(
        cells["whole_tick_ms_p50"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{cells}"
    );
}

/// `--kernel` picks the neighbour kernel; every path computes the same
/// flock (the same order metric to the last bit), and the line names it.
#[test]
fn every_kernel_path_gives_the_same_flock_and_is_named() {
    let run = |kernel: &str| {
        bench_line(&[
            "--scenario",
            "kernel",
            "--population",
            "3000",
            "--threads",
            "2",
            "--ticks",
            "3",
            "--warmup",
            "2",
            "--kernel",
            kernel,
        ])
    };
    let auto = run("auto");
    let portable = run("portable");
    assert_eq!(portable["kernel"], "portable");
    assert_ne!(auto["kernel"], serde_json::Value::Null);
    assert_eq!(auto["order"], portable["order"]);
    assert_eq!(auto["candidates_per_boid"], portable["candidates_per_boid"]);
    let bad = starling_bench(&["--kernel", "sse9"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("sse9") && err.contains("avx512"), "{err}");
}

/// The interest scenario reports a probe that stays within its budget,
/// sees the whole flock as summaries, and is sent its view; one line per
/// viewer count, with a bounded number of encodes per broadcast.
#[test]
fn the_interest_bench_keeps_the_budget_and_shares_encodes() {
    let out = starling_bench(&[
        "--scenario",
        "interest",
        "--population",
        "5000",
        "--viewers",
        "10",
        "--seconds",
        "2",
        "--warmup",
        "30",
        "--budget",
        "64000",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let viewers: Vec<u64> = lines
        .iter()
        .map(|l| l["viewers"].as_u64().unwrap())
        .collect();
    assert_eq!(viewers, [1, 10]);
    for l in &lines {
        assert_eq!(l["scenario"], "interest");
        assert_eq!(l["summaries_cover"], 1.0, "{l}");
        assert!(l["probe_budget_ratio"].as_f64().unwrap() <= 1.1, "{l}");
        assert!(l["in_view_update_hz_mean"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["in_box_share_never_updated"].is_number(), "{l}");
        // At most a full and three linear forms of each cell.
        let cells = l["cells"].as_f64().unwrap();
        assert!(
            l["encodes_per_broadcast"].as_f64().unwrap() <= 4.0 * cells,
            "{l}"
        );
    }
}

/// Benchmark C runs a live server for its viewers and reports that
/// server's tick rate; `--b-world` gives the server scenario B's world for
/// the population (the default world otherwise).
#[test]
fn the_fanout_bench_reports_the_live_tick_in_the_world_it_asked_for() {
    let run = |b_world: bool| {
        let mut args = vec![
            "--scenario",
            "fanout",
            "--population",
            "20000",
            "--viewers",
            "2",
            "--seconds",
            "1",
        ];
        if b_world {
            args.push("--b-world");
        }
        bench_line(&args)
    };
    let world = |line: &serde_json::Value| -> Vec<f64> {
        let w = line["world_m"]
            .as_array()
            .unwrap_or_else(|| panic!("{line}"));
        w.iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let default = run(false);
    let b = run(true);
    let want = starling_sim::scenarios::full_b(20_000).params.world_m;
    assert_eq!(world(&b), want.map(f64::from).to_vec(), "{b}");
    assert_eq!(
        world(&default),
        starling_sim::Params::default()
            .world_m
            .map(f64::from)
            .to_vec(),
        "{default}"
    );
    assert!(
        world(&b)[0] > world(&default)[0],
        "B's world grows with the flock"
    );
    for line in [&default, &b] {
        assert_eq!(line["scenario"], "C-fanout");
        assert_eq!(line["viewers_alive"], 2, "{line}");
        let ticks = line["ticks_per_s"].as_f64().unwrap();
        assert!(ticks > 0.0 && ticks <= 65.0, "a 60 Hz server: {line}");
    }
}
