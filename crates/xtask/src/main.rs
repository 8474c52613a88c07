//! Build and test automation: `cargo xtask <command>`. The only crate that
//! shells out to other tools.
//!
//! - `cargo xtask test`: fmt check, clippy `-D warnings`, every workspace test,
//!   and the engine's tests again without the `parallel` feature (the golden
//!   digest proves serial and parallel runs are bit-identical).
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
    println!("xtask test: all checks passed");
    Ok(())
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
