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
//! - `cargo xtask bench`: `starling bench` in release mode (scenarios A and B).
//!
//! What is missing is installed where it can be: the wasm32 target
//! (rustup), the wasm-bindgen CLI of exactly the version in Cargo.lock
//! (cargo install), npm packages (npm ci), Debian chromium (apt-get, as
//! root). Otherwise the error says what to install.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "test" => test(),
        "run" => run(),
        "web" => build_web().map(|_| ()),
        "bench" => cargo(&["run", "--release", "-p", "starling-server", "--", "bench"]),
        _ => {
            eprintln!("usage: cargo xtask <test | run [serve flags…] | web | bench>");
            bail!("unknown task {task:?}: expected test, run, web or bench")
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
    cargo(&["test", "--workspace"])?;
    cargo(&["test", "-p", "starling-sim", "--no-default-features"])?;
    wasm_golden()?;
    let wasm_bytes = build_web()?;
    if wasm_bytes > WASM_BUDGET_BYTES {
        bail!("the viewer's wasm is {wasm_bytes} bytes, over the {WASM_BUDGET_BYTES}-byte budget");
    }
    browser_tests()?;
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
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        bail!(
            "the browser tests need Debian's chromium at {CHROMIUM}: run `sudo apt-get install chromium`"
        );
    }
    run_tool(
        Command::new("apt-get").arg("update").arg("-qq"),
        "apt-get update",
    )?;
    run_tool(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install chromium",
    )
}

const CHROMIUM: &str = "/usr/bin/chromium";

/// The browser tests against a real server with the built viewer.
fn browser_tests() -> Result<()> {
    ensure_chromium()?;
    npm_install()?;
    cargo(&["build", "-p", "starling-server"])?;
    let root = workspace_root();
    let artifacts = root.join("target/browser-artifacts");
    std::fs::create_dir_all(&artifacts)?;
    run_tool(
        Command::new("node")
            .args(["--test", "--test-concurrency=1", "viewer.test.mjs"])
            .current_dir(root.join("tests/browser"))
            .env("STARLING_BIN", root.join("target/debug/starling"))
            .env("STARLING_WEB_DIR", root.join("web-client/dist"))
            .env("STARLING_ARTIFACTS", &artifacts)
            .env("CHROMIUM", CHROMIUM),
        "the browser tests",
    )
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
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup: the wasm32 target needs a rustup-managed toolchain")?;
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == WASM_TARGET)
    {
        return Ok(());
    }
    eprintln!("+ rustup target add {WASM_TARGET}");
    let status = Command::new("rustup")
        .args(["target", "add", WASM_TARGET])
        .status()
        .context("running rustup")?;
    if !status.success() {
        bail!("`rustup target add {WASM_TARGET}` failed: install it by hand");
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

fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("+ cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` failed with {status}", args.join(" "));
    }
    Ok(())
}
