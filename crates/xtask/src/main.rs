//! Build and test automation: `cargo xtask <command>`. The only crate that
//! shells out to other tools.
//!
//! - `cargo xtask test`: fmt check, clippy `-D warnings`, every workspace test,
//!   the engine's tests again without the `parallel` feature (the golden
//!   digest proves serial and parallel runs are bit-identical), and the
//!   protocol built for `wasm32-unknown-unknown` with its golden vectors
//!   checked inside wasm by Node.
//! - `cargo xtask bench`: `starling bench` in release mode (scenarios A and B).

use std::process::Command;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "test" => test(),
        "bench" => cargo(&["run", "--release", "-p", "starling-server", "--", "bench"]),
        _ => {
            eprintln!("usage: cargo xtask <test | bench>");
            bail!("unknown task {task:?}: expected test or bench")
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
    println!("xtask test: all checks passed");
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
