//! A tmpfs of a chosen size for tests of small and full volumes. Mounting
//! needs root: [`Tmpfs::mount`] answers None where it cannot, and the test
//! says it was skipped.

use std::path::Path;
use std::process::Command;

/// A tmpfs mounted on a fresh temporary directory, unmounted when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `size` as mount(8) takes it: "64m", "1m".
    pub fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs { dir })
    }

    /// Grows (or shrinks) the mounted volume.
    pub fn resize(&self, size: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "remount to {size}");
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}
