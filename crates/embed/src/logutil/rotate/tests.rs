use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// 2024-03-05T06:07:08.009Z
const START_MILLIS: u64 = 1_709_618_828_009;

/// A clock that starts at START_MILLIS and moves one second each reading,
/// so that every rotation gets its own backup name.
fn ticking_clock() -> Clock {
    let readings = Arc::new(AtomicU64::new(0));
    Arc::new(move || {
        let n = readings.fetch_add(1, Ordering::SeqCst);
        UNIX_EPOCH + Duration::from_millis(START_MILLIS + n * 1000)
    })
}

fn fixed_clock(millis: u64) -> Clock {
    Arc::new(move || UNIX_EPOCH + Duration::from_millis(millis))
}

use std::time::Duration;

/// Files in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// maxsize 1 with 100-byte "megabytes": the file holds at most 100 bytes.
fn small(dir: &Path, config: RotationConfig, clock: Clock) -> RotatingFile {
    let config = RotationConfig {
        max_size: 1,
        ..config
    };
    RotatingFile::for_test(dir.join("app.log"), config, 100, clock)
}

#[test]
fn a_write_that_would_pass_maxsize_rotates_first_into_lumberjacks_backup_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = small(
        dir.path(),
        RotationConfig::default(),
        fixed_clock(START_MILLIS),
    );
    log.write_all(&[b'a'; 60]).unwrap();
    log.write_all(&[b'b'; 40]).unwrap();
    // exactly 100 bytes: still one file
    assert_eq!(names(dir.path()), ["app.log"]);
    log.write_all(&[b'c'; 10]).unwrap();
    assert_eq!(
        names(dir.path()),
        ["app-2024-03-05T06-07-08.009.log", "app.log"]
    );
    let backup = fs::read(dir.path().join("app-2024-03-05T06-07-08.009.log")).unwrap();
    assert_eq!(backup.len(), 100);
    assert_eq!(fs::read(dir.path().join("app.log")).unwrap(), [b'c'; 10]);
}

#[test]
fn a_write_larger_than_maxsize_is_refused_in_lumberjacks_words() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = small(
        dir.path(),
        RotationConfig::default(),
        fixed_clock(START_MILLIS),
    );
    let e = log.write(&[b'x'; 101]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "write length 101 exceeds maximum file size 100"
    );
    // a negative maxsize refuses every write, as lumberjack's
    let mut log = RotatingFile::for_test(
        dir.path().join("neg.log"),
        RotationConfig {
            max_size: -1,
            ..Default::default()
        },
        100,
        fixed_clock(START_MILLIS),
    );
    let e = log.write(b"x").unwrap_err();
    assert_eq!(
        e.to_string(),
        "write length 1 exceeds maximum file size -100"
    );
}

#[test]
fn maxsize_zero_is_lumberjacks_hundred_megabytes() {
    let log = RotatingFile::new(PathBuf::from("x.log"), RotationConfig::default());
    assert_eq!(log.max(), 100 * 1024 * 1024);
}

#[test]
fn an_existing_file_is_appended_to_when_the_write_fits_and_rotated_when_it_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.log");
    fs::write(&path, [b'o'; 50]).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let mut log = small(
        dir.path(),
        RotationConfig::default(),
        fixed_clock(START_MILLIS),
    );
    log.write_all(&[b'n'; 49]).unwrap();
    assert_eq!(fs::read(&path).unwrap().len(), 99);
    drop(log);
    // lumberjack opens an existing file only if size + write < max
    let mut log = small(
        dir.path(),
        RotationConfig::default(),
        fixed_clock(START_MILLIS),
    );
    log.write_all(b"z").unwrap();
    assert_eq!(
        names(dir.path()),
        ["app-2024-03-05T06-07-08.009.log", "app.log"]
    );
    assert_eq!(fs::read(&path).unwrap(), b"z");
    // the new file keeps the old one's mode
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn maxbackups_keeps_the_newest_backups() {
    let dir = tempfile::tempdir().unwrap();
    let config = RotationConfig {
        max_backups: 2,
        ..Default::default()
    };
    let mut log = small(dir.path(), config, ticking_clock());
    for fill in b'a'..=b'e' {
        log.write_all(&[fill; 80]).unwrap();
    }
    let names = names(dir.path());
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[2], "app.log");
    // the two newest backups hold the two fills before the current one
    assert_eq!(fs::read(dir.path().join(&names[0])).unwrap(), [b'c'; 80]);
    assert_eq!(fs::read(dir.path().join(&names[1])).unwrap(), [b'd'; 80]);
    assert_eq!(fs::read(dir.path().join("app.log")).unwrap(), [b'e'; 80]);
}

#[test]
fn maxage_removes_backups_older_than_its_days_by_the_time_in_their_names() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "app-2024-02-20T00-00-00.000.log",
        "app-2024-03-04T06-07-08.009.log",
        "app-2024-01-01T00-00-00.000.log.gz",
        "app-notatime.log",
        "other-2024-01-01T00-00-00.000.log",
    ] {
        fs::write(dir.path().join(name), b"old").unwrap();
    }
    let config = RotationConfig {
        max_age: 2,
        ..Default::default()
    };
    let mut log = small(dir.path(), config, fixed_clock(START_MILLIS));
    log.write_all(b"new").unwrap();
    assert_eq!(
        names(dir.path()),
        [
            "app-2024-03-04T06-07-08.009.log",
            "app-notatime.log",
            "app.log",
            "other-2024-01-01T00-00-00.000.log",
        ]
    );
}

#[test]
fn compress_gzips_rotated_files_and_counts_a_backup_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = RotationConfig {
        compress: true,
        max_backups: 2,
        ..Default::default()
    };
    let mut log = small(dir.path(), config, ticking_clock());
    for fill in b'a'..=b'd' {
        log.write_all(&[fill; 80]).unwrap();
    }
    let names = names(dir.path());
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names[0].ends_with(".log.gz") && names[1].ends_with(".log.gz"));
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(File::open(dir.path().join(&names[1])).unwrap())
        .read_to_end(&mut text)
        .unwrap();
    assert_eq!(text, [b'c'; 80]);
}

#[test]
fn backup_names_split_the_extension_as_go_does() {
    assert_eq!(
        backup_name(Path::new("/var/log/etcd.log"), UNIX_EPOCH, false),
        Path::new("/var/log/etcd-1970-01-01T00-00-00.000.log")
    );
    assert_eq!(
        backup_name(
            Path::new("etcd"),
            UNIX_EPOCH + Duration::from_millis(1),
            false
        ),
        Path::new("./etcd-1970-01-01T00-00-00.001")
    );
    assert_eq!(
        backup_name(Path::new("/x/a.b.txt"), UNIX_EPOCH, false),
        Path::new("/x/a.b-1970-01-01T00-00-00.000.txt")
    );
}

#[test]
fn only_lumberjacks_timestamps_are_backup_names() {
    let t = |name: &str| time_from_name(name, "app-", ".log");
    assert_eq!(
        t("app-2024-03-05T06-07-08.009.log"),
        Some(START_MILLIS as i64)
    );
    assert_eq!(t("app-2024-02-30T06-07-08.009.log"), None);
    assert_eq!(t("app-2024-03-05T06-07-08.9.log"), None);
    assert_eq!(t("app-2024-03-05 06-07-08.009.log"), None);
    assert_eq!(t("app-2024-03-05T06-07-08.009.txt"), None);
}
