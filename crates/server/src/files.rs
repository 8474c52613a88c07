//! Reading the files a user names (a config, a scenario, a checkpoint, a
//! recording): only regular files, and no more of them than a named
//! limit. `/dev/zero` given as a config was read until memory ran out,
//! and a FIFO blocked the server's start for ever (opening one waits for
//! a writer), so the kind is checked before the file is opened.

use std::io::Read as _;
use std::path::Path;

/// Why a named file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Not a regular file (a directory, a FIFO, a device).
    #[error("not a regular file")]
    NotAFile,
    /// Larger than its limit.
    #[error("{size} bytes, more than the {max} allowed ({what})")]
    TooLarge {
        /// Its size (at least; a file still growing may be larger).
        size: u64,
        /// The limit.
        max: u64,
        /// The limit's name.
        what: &'static str,
    },
    /// It could not be read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Checks that `path` is a regular file (without opening it: opening a
/// FIFO waits for a writer).
pub fn check_regular(path: &Path) -> Result<std::fs::Metadata, FileError> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() {
        Ok(meta)
    } else {
        Err(FileError::NotAFile)
    }
}

/// The text of the regular file at `path`, at most `max` bytes (`what`
/// names the limit in the error).
pub fn read_text(path: &Path, max: u64, what: &'static str) -> Result<String, FileError> {
    let size = check_regular(path)?.len();
    let too_large = |size| FileError::TooLarge { size, max, what };
    if size > max {
        return Err(too_large(size));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_string(&mut text)?;
    // It grew since its size was read.
    if text.len() as u64 > max {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_their_limit_are_read() {
        let dir = crate::scratch_dir("files");
        let small = dir.join("small.toml");
        std::fs::write(&small, "seed = 3\n").unwrap();
        assert_eq!(read_text(&small, 9, "MAX").unwrap(), "seed = 3\n");
        let e = read_text(&small, 8, "MAX_TEST_BYTES").unwrap_err();
        assert!(
            matches!(
                e,
                FileError::TooLarge {
                    size: 9,
                    max: 8,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("MAX_TEST_BYTES"), "{e}");
        // A directory, a device and a FIFO are refused unopened (a FIFO
        // opened would wait here for a writer).
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        let mut others = vec![dir.clone(), "/dev/zero".into()];
        if made {
            others.push(fifo);
        }
        for other in others {
            let e = read_text(&other, 1 << 20, "MAX").unwrap_err();
            assert!(matches!(e, FileError::NotAFile), "{other:?}: {e}");
        }
        assert!(matches!(
            read_text(&dir.join("missing"), 10, "MAX"),
            Err(FileError::Io(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
