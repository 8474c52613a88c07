//! The files a user names. A config, a scenario and a checkpoint are
//! read only as regular files and no more of them than a named limit
//! ([`read_text`]); a recording is checked the same way ([`check_regular`])
//! and read line by line within its own limit. `/dev/zero` given as a
//! config was read until memory ran out, and a FIFO blocked the server's
//! start for ever (opening one waits for a writer), so the kind is checked
//! before the file is opened; the NATS TLS files are read the same way
//! before the server starts. And [`same_place`]: whether two paths name one
//! file, for outputs that must not share one.

use std::io::Read as _;
use std::path::Path;

/// Why a named file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Not a regular file (a directory, a FIFO, a device).
    #[error(
        "not a regular file (a folder, a pipe such as `<(...)`, or a device): write it to a file"
    )]
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

/// Whether `a` and `b` name one file: one name in one folder, the folder
/// resolved when it exists (so `./x` and `x`, or a link to the folder,
/// are one), else as written.
pub fn same_place(a: &Path, b: &Path) -> bool {
    let place = |p: &Path| {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        (
            dir.canonicalize().unwrap_or(dir),
            p.file_name().map(ToOwned::to_owned),
        )
    };
    place(a) == place(b)
}

/// The text of the regular file at `path`, at most `max` bytes (`what`
/// names the limit in the error).
pub fn read_text(path: &Path, max: u64, what: &'static str) -> Result<String, FileError> {
    let bytes = read_bytes(path, max, what)?;
    String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e).into())
}

/// The bytes of the regular file at `path`, at most `max` (`what` names
/// the limit in the error).
pub fn read_bytes(path: &Path, max: u64, what: &'static str) -> Result<Vec<u8>, FileError> {
    let size = check_regular(path)?.len();
    let too_large = |size| FileError::TooLarge { size, max, what };
    if size > max {
        return Err(too_large(size));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut bytes)?;
    // It grew since its size was read.
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
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
        // (coreutils' `mkfifo`: std makes no FIFOs, and this crate has no
        // unsafe code for libc's.)
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {fifo:?}");
        for other in [dir.clone(), "/dev/zero".into(), fifo] {
            let e = read_text(&other, 1 << 20, "MAX").unwrap_err();
            assert!(matches!(e, FileError::NotAFile), "{other:?}: {e}");
        }
        assert!(matches!(
            read_text(&dir.join("missing"), 10, "MAX"),
            Err(FileError::Io(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_name_in_one_folder_is_one_place() {
        let dir = crate::scratch_dir("places");
        let p = |s: &str| dir.join(s);
        assert!(same_place(&p("x"), &p("./x")));
        assert!(same_place(&p("x"), &dir.join("sub/../x")) == dir.join("sub").exists());
        assert!(!same_place(&p("x"), &p("x.partial")));
        assert!(same_place(Path::new("x"), Path::new("./x")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
