//! etcd's file modes for a member's files (client/pkg/fileutil): the
//! directories it creates are 0700 and its WAL and backend files 0600, so
//! that no other local user reads the data. An existing directory with
//! another mode is used as it is, with etcd's warning: etcd never refuses
//! to start over permissions, only over a directory it cannot write.

use std::fs;
use std::io;
use std::path::Path;

/// etcd's `PrivateDirMode`.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// etcd's `PrivateFileMode`.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates `dir` and its missing parents with mode 0700 (Go's
/// `os.MkdirAll(dir, PrivateDirMode)`); an existing one is left as it is.
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, PRIVATE_DIR_MODE);
    builder.create(dir)
}

/// Opens `path` for writing, creating it with mode 0600 if it is missing
/// (an existing file keeps its mode and content).
pub fn create_private_file(path: &Path) -> io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, PRIVATE_FILE_MODE);
    options.open(path)
}

/// etcd's `TouchDirAll`: an existing `dir` whose permission bits are not
/// 0700 gets etcd's `check file permission` warning; a missing one is
/// created 0700. Either way the directory must be writable.
pub fn touch_dir_all(dir: &Path) -> io::Result<()> {
    match fs::metadata(dir) {
        Ok(meta) => {
            if let Some(problem) = permission_problem(dir, &meta) {
                tracing::warn!(error = %problem, "check file permission");
            }
        }
        Err(_) => create_private_dir_all(dir)?,
    }
    is_dir_writeable(dir)
}

/// etcd's `CheckDirPermission` message, if `dir`'s permission bits are
/// not 0700.
fn permission_problem(dir: &Path, meta: &fs::Metadata) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o777 == PRIVATE_DIR_MODE {
            return None;
        }
        Some(format!(
            "directory {:?} exist, but the permission is {:?}. The recommended permission is {:?} to prevent possible unprivileged access to the data",
            dir.display().to_string(),
            go_file_mode(mode, meta.is_dir()),
            go_file_mode(PRIVATE_DIR_MODE, false),
        ))
    }
    #[cfg(not(unix))]
    {
        let _ = (dir, meta);
        None
    }
}

/// etcd's `IsDirWriteable`: creates and removes `dir/.touch`.
fn is_dir_writeable(dir: &Path) -> io::Result<()> {
    let touch = dir.join(".touch");
    create_private_file(&touch)?;
    fs::remove_file(&touch)
}

/// A mode as Go's `os.FileMode.String` prints it: "drwxr-xr-x",
/// "-rwx------", with `u`, `g`, `t` for setuid, setgid and sticky.
pub fn go_file_mode(mode: u32, is_dir: bool) -> String {
    let mut out = String::new();
    if is_dir {
        out.push('d');
    }
    for (bit, letter) in [(0o4000, 'u'), (0o2000, 'g'), (0o1000, 't')] {
        if mode & bit != 0 {
            out.push(letter);
        }
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, letter) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (1 << (8 - i)) != 0 {
            letter
        } else {
            '-'
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_print_as_go_prints_them() {
        assert_eq!(go_file_mode(0o755, true), "drwxr-xr-x");
        assert_eq!(go_file_mode(0o700, false), "-rwx------");
        assert_eq!(go_file_mode(0o2750, true), "dgrwxr-x---");
    }

    #[cfg(unix)]
    #[test]
    fn new_dirs_are_private_and_existing_ones_are_kept() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let nested = tmp.path().join("a").join("b");
        touch_dir_all(&nested).unwrap();
        for dir in [tmp.path().join("a"), nested.clone()] {
            let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", dir.display());
        }
        fs::set_permissions(&nested, fs::Permissions::from_mode(0o755)).unwrap();
        touch_dir_all(&nested).unwrap();
        let mode = fs::metadata(&nested).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "an existing dir keeps its mode");
        let meta = fs::metadata(&nested).unwrap();
        let problem = permission_problem(&nested, &meta).unwrap();
        assert!(
            problem.ends_with(
                "exist, but the permission is \"drwxr-xr-x\". The recommended permission is \"-rwx------\" to prevent possible unprivileged access to the data"
            ),
            "{problem}"
        );
    }
}
