//! What a run writes (`--out`, `--record`, `--mcap`): never over something
//! that exists, and never looking finished unless the run finished. Each
//! output is written at its partial twin, its name with `.partial`
//! appended, and renamed into place only on success; a failed run removes
//! it. A partial twin that exists already is refused, not removed: another
//! run may be writing it.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// `path` and its partial twin, `path` with `.partial` appended to its
/// last component (`out/w1.5` -> `out/w1.5.partial`: distinct outputs
/// never share a twin; `out/` -> `out.partial`). A path with no last
/// name (`..`, `/`) is refused.
fn named(path: &Path, flag: &str) -> Result<(PathBuf, PathBuf)> {
    let Some(name) = path.file_name() else {
        bail!("{flag} {}: not a file or folder name", path.display());
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut twin = name.to_owned();
    twin.push(".partial");
    Ok((dir.join(name), dir.join(twin)))
}

/// `path`'s partial twin (see [`named`]).
#[cfg(test)]
fn partial_of(path: &Path) -> Result<PathBuf> {
    named(path, "path").map(|(_, twin)| twin)
}

/// Refuses outputs (`(flag, path)`) that share a path, or where one's
/// path is another's partial twin: each would fail, or take the other's
/// place, only once the run is done.
pub fn refuse_shared_paths(outputs: &[(&str, &Path)]) -> Result<()> {
    for (k, &(flag_a, a)) in outputs.iter().enumerate() {
        for &(flag_b, b) in &outputs[k + 1..] {
            let (pa, ta) = named(a, flag_a)?;
            let (pb, tb) = named(b, flag_b)?;
            let clash = [&pa, &ta]
                .iter()
                .any(|x| [&pb, &tb].iter().any(|y| crate::files::same_place(x, y)));
            if clash {
                bail!(
                    "{flag_a} {} and {flag_b} {}: one file (or one's partial twin, written while the run goes): give each output its own path",
                    a.display(),
                    b.display()
                );
            }
        }
    }
    Ok(())
}

/// Refuses `path` (given by `flag`) when it, or its partial twin, exists;
/// else both, cleaned.
fn check_new(path: &Path, flag: &str) -> Result<(PathBuf, PathBuf)> {
    let (path, partial) = named(path, flag)?;
    if path.exists() {
        bail!(
            "{flag} {}: it exists, and a run never overwrites: choose another path or remove it",
            path.display()
        );
    }
    if partial.exists() {
        bail!(
            "{flag} {}: {} exists (another run writing it, or one that was killed): remove it if no run is",
            path.display(),
            partial.display()
        );
    }
    Ok((path, partial))
}

/// Calls `write` on the directory's partial twin (created) and renames it
/// to `dir` only when it succeeded; `dir` must not exist. Everything else
/// the run puts in place goes inside `write`, so the folder comes last. A
/// failed `write` removes the twin; a finished run whose folder cannot be
/// put in place (one appeared meanwhile) is kept at the twin, and said so.
pub fn written_dir<T>(dir: &Path, flag: &str, write: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let (dir, partial) = check_new(dir, flag)?;
    // The outermost folder this makes for it, removed with it on failure.
    let mut made = None;
    if let Some(parent) = partial.parent().filter(|p| !p.as_os_str().is_empty()) {
        made = parent
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .last()
            .map(Path::to_path_buf);
        std::fs::create_dir_all(parent)
            .with_context(|| format!("{flag}: creating {}", parent.display()))?;
    }
    // `create_dir`, not `_all`: two runs racing for one twin, one fails.
    std::fs::create_dir(&partial)
        .with_context(|| format!("{flag}: creating {}", partial.display()))?;
    let out = match write(&partial) {
        Ok(out) => out,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            // Then the folders made for it, innermost first, while empty
            // (one another run has put something in since stays).
            if let (Some(made), Some(parent)) = (made, partial.parent()) {
                for a in parent.ancestors() {
                    if std::fs::remove_dir(a).is_err() || a == made {
                        break;
                    }
                }
            }
            return Err(e);
        }
    };
    // The run finished: whatever stops the rename, its folder is kept.
    // (Checked again: a rename would replace an empty folder that appeared.)
    if dir.exists() {
        bail!(
            "{flag} {} appeared while the run wrote it: the finished run is left at {}",
            dir.display(),
            partial.display()
        );
    }
    std::fs::rename(&partial, &dir).with_context(|| {
        format!(
            "{flag}: the finished run is left at {}: renaming it to {}",
            partial.display(),
            dir.display()
        )
    })?;
    Ok(out)
}

/// A new file written at its partial twin, which this creates (so no other
/// run can have it): [`NewFile::commit`] renames it into place; dropped
/// uncommitted (the run failed), the twin is removed.
#[derive(Debug)]
pub struct NewFile {
    path: PathBuf,
    partial: PathBuf,
    file: Option<File>,
    /// Renamed into place, or left for the user: not to be removed.
    kept: bool,
}

impl NewFile {
    /// Refuses `path` (given by `flag`) when it or its twin exists, or its
    /// directory does not; creates the twin.
    pub fn new(path: &Path, flag: &str) -> Result<Self> {
        let (path, partial) = check_new(path, flag)?;
        let dir = partial.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            bail!("{flag} {}: its directory does not exist", path.display());
        }
        let file = File::create_new(&partial).with_context(|| {
            format!("{flag} {}: creating {}", path.display(), partial.display())
        })?;
        Ok(Self {
            path,
            partial,
            file: Some(file),
            kept: false,
        })
    }

    /// The twin, open for writing (once).
    pub fn take_file(&mut self) -> Result<File> {
        self.file
            .take()
            .with_context(|| format!("{} taken twice", self.partial.display()))
    }

    /// The path given for it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The twin's path (for messages).
    pub fn partial(&self) -> &Path {
        &self.partial
    }

    /// Renames the written twin into place (an error leaves it where it is).
    pub fn commit(mut self) -> Result<()> {
        self.kept = true;
        if self.path.exists() {
            bail!(
                "{} appeared while the run wrote it: the run's is left at {}",
                self.path.display(),
                self.partial.display()
            );
        }
        std::fs::rename(&self.partial, &self.path).with_context(|| {
            format!(
                "renaming {} to {}",
                self.partial.display(),
                self.path.display()
            )
        })
    }
}

impl Drop for NewFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("starling-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Outputs at one path, or one at another's partial twin, are refused
    /// before the run (they failed at its end, and the run was lost).
    #[test]
    fn outputs_sharing_a_path_are_refused_before_the_run() {
        let p = Path::new;
        for (a, b) in [
            (("--out", p("o2")), ("--record", p("o2"))),
            (("--record", p("r7")), ("--mcap", p("r7.partial"))),
            (("--out", p("o5")), ("--record", p("o5.partial"))),
            (("--out", p("./x")), ("--mcap", p("x"))),
        ] {
            let e = refuse_shared_paths(&[a, b]).unwrap_err().to_string();
            assert!(e.contains(a.0) && e.contains(b.0), "{e}");
        }
        refuse_shared_paths(&[
            ("--out", p("out")),
            ("--record", p("out.jsonl")),
            ("--mcap", p("out.mcap")),
        ])
        .unwrap();
    }

    #[test]
    fn outputs_have_twins_of_their_own_and_a_nameless_path_is_refused() {
        let d = scratch("twins");
        let twin = |p: &Path| partial_of(p).unwrap();
        assert_ne!(twin(&d.join("w1.5")), twin(&d.join("w1.7")));
        assert_eq!(twin(&d.join("w1.5")), d.join("w1.5.partial"));
        // `out/` is the folder `out`, its twin beside it, not inside it.
        assert_eq!(twin(Path::new("runs/out/")), Path::new("runs/out.partial"));
        assert!(partial_of(Path::new("runs/..")).is_err());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_file_is_in_place_only_once_committed_and_gone_when_dropped() {
        let d = scratch("file");
        let path = d.join("run.jsonl");
        let mut f = NewFile::new(&path, "--record").unwrap();
        std::io::Write::write_all(&mut f.take_file().unwrap(), b"x").unwrap();
        // A second run for the same path is refused while the first writes,
        // and its refusal removes nothing.
        let e = NewFile::new(&path, "--record").unwrap_err().to_string();
        assert!(e.contains("run.jsonl.partial exists"), "{e}");
        assert!(f.partial().exists());
        drop(f);
        assert!(!path.exists() && !partial_of(&path).unwrap().exists());
        let mut f = NewFile::new(&path, "--record").unwrap();
        std::io::Write::write_all(&mut f.take_file().unwrap(), b"x").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x");
        let e = NewFile::new(&path, "--record").unwrap_err().to_string();
        assert!(
            e.contains("--record") && e.contains("never overwrites"),
            "{e}"
        );
        // A file that appeared meanwhile is not replaced, and the run's
        // own is left, not removed.
        let other = d.join("other.jsonl");
        let f = NewFile::new(&other, "--record").unwrap();
        std::fs::write(&other, "theirs").unwrap();
        assert!(f.commit().is_err());
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "theirs");
        assert!(partial_of(&other).unwrap().exists());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_directory_is_renamed_into_place_only_when_its_writer_succeeds() {
        let d = scratch("dir");
        let out = d.join("w1.5");
        let e = written_dir(&out, "--out", |p| -> Result<()> {
            std::fs::write(p.join("metrics.csv"), "a")?;
            bail!("the run failed")
        });
        assert!(e.is_err());
        assert!(!out.exists() && !partial_of(&out).unwrap().exists());
        // Folders made for it go with it; one that was there stays.
        let deep = d.join("a/b/run");
        assert!(written_dir(&deep, "--out", |_| -> Result<()> { bail!("failed") }).is_err());
        assert!(!d.join("a").exists() && d.exists());
        let slash = format!("{}/", out.display());
        written_dir(Path::new(&slash), "--out", |p| {
            std::fs::write(p.join("metrics.csv"), "b").map_err(Into::into)
        })
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(out.join("metrics.csv")).unwrap(),
            "b"
        );
        assert!(written_dir(&out, "--out", |_| Ok(())).is_err());
        // A folder that appears while a run writes is not replaced, and the
        // finished run is kept beside it.
        let late = d.join("late");
        let e = written_dir(&late, "--out", |p| {
            std::fs::write(p.join("metrics.csv"), "c")?;
            std::fs::create_dir(d.join("late")).map_err(Into::into)
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("late.partial"), "{e}");
        assert_eq!(
            std::fs::read_to_string(d.join("late.partial/metrics.csv")).unwrap(),
            "c"
        );
        std::fs::remove_dir_all(d).unwrap();
    }
}
