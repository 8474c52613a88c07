//! What a run writes (`--out`, `--record`, `--mcap`): never over something
//! that exists, and never looking finished unless the run finished. Each
//! output is written at its partial twin, its name with `.partial`
//! appended, and renamed into place only on success; a failed run removes
//! it. A partial twin that exists already is refused, not removed: another
//! run may be writing it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// `path` with `.partial` appended to its name (`out/w1.5` ->
/// `out/w1.5.partial`: distinct outputs never share a twin).
pub fn partial_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Refuses `path` (given by `flag`) when it, or its partial twin, exists.
fn check_new(path: &Path, flag: &str) -> Result<PathBuf> {
    if path.exists() {
        bail!(
            "{flag} {}: it exists, and a run never overwrites: choose another path or remove it",
            path.display()
        );
    }
    let partial = partial_of(path);
    if partial.exists() {
        bail!(
            "{flag} {}: {} exists (another run writing it, or one that was killed): remove it if no run is",
            path.display(),
            partial.display()
        );
    }
    Ok(partial)
}

/// Calls `write` on the directory's partial twin (created) and renames it
/// to `dir` only when it succeeded; `dir` must not exist.
pub fn written_dir<T>(dir: &Path, flag: &str, write: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let partial = check_new(dir, flag)?;
    if let Some(parent) = partial.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("{flag}: creating {}", parent.display()))?;
    }
    // `create_dir`, not `_all`: two runs racing for one twin, one fails.
    std::fs::create_dir(&partial)
        .with_context(|| format!("{flag}: creating {}", partial.display()))?;
    match write(&partial) {
        Ok(out) => {
            std::fs::rename(&partial, dir).with_context(|| {
                format!(
                    "{flag}: renaming {} to {}",
                    partial.display(),
                    dir.display()
                )
            })?;
            Ok(out)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

/// A file written at its partial twin: [`NewFile::commit`] renames it
/// into place; dropped uncommitted (the run failed), the twin is removed.
#[derive(Debug)]
pub struct NewFile {
    path: PathBuf,
    partial: PathBuf,
    committed: bool,
}

impl NewFile {
    /// Refuses `path` (given by `flag`) when it or its twin exists.
    pub fn new(path: &Path, flag: &str) -> Result<Self> {
        let partial = check_new(path, flag)?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            bail!("{flag} {}: its directory does not exist", path.display());
        }
        Ok(Self {
            path: path.to_owned(),
            partial,
            committed: false,
        })
    }

    /// Where to write it (create it with `create_new`: a twin that
    /// appeared since [`NewFile::new`] is another run's).
    pub fn partial(&self) -> &Path {
        &self.partial
    }

    /// Renames the written twin into place.
    pub fn commit(mut self) -> Result<()> {
        if self.path.exists() {
            bail!(
                "{} appeared while the run wrote it: left at {}",
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
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for NewFile {
    fn drop(&mut self) {
        if !self.committed {
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

    #[test]
    fn outputs_differing_after_a_dot_have_their_own_twins() {
        let d = scratch("twins");
        assert_ne!(partial_of(&d.join("w1.5")), partial_of(&d.join("w1.7")));
        assert_eq!(partial_of(&d.join("w1.5")), d.join("w1.5.partial"));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_file_is_in_place_only_once_committed_and_gone_when_dropped() {
        let d = scratch("file");
        let path = d.join("run.jsonl");
        let f = NewFile::new(&path, "--record").unwrap();
        std::fs::write(f.partial(), "x").unwrap();
        // A second run for the same path is refused while the first writes.
        let e = NewFile::new(&path, "--record").unwrap_err().to_string();
        assert!(e.contains("run.jsonl.partial exists"), "{e}");
        drop(f);
        assert!(!path.exists() && !partial_of(&path).exists());
        let f = NewFile::new(&path, "--record").unwrap();
        std::fs::write(f.partial(), "x").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x");
        let e = NewFile::new(&path, "--record").unwrap_err().to_string();
        assert!(
            e.contains("--record") && e.contains("never overwrites"),
            "{e}"
        );
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
        assert!(!out.exists() && !partial_of(&out).exists());
        written_dir(&out, "--out", |p| {
            std::fs::write(p.join("metrics.csv"), "b").map_err(Into::into)
        })
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(out.join("metrics.csv")).unwrap(),
            "b"
        );
        assert!(written_dir(&out, "--out", |_| Ok(())).is_err());
        std::fs::remove_dir_all(d).unwrap();
    }
}
