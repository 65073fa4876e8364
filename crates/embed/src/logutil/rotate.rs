//! A log file that rotates itself as etcd's lumberjack (gopkg.in/natefinch/
//! lumberjack.v2 v2.0.0) does, for `--enable-log-rotation`: the size is
//! checked before each write; a write that would take the file past
//! `maxsize` MB first renames it to `name-2006-01-02T15-04-05.000.ext`
//! (UTC unless `localtime`) and starts a new one. After a rotation a
//! background thread ("the mill") removes backups beyond `maxbackups` and
//! older than `maxage` days (by the time in their names) and gzips the
//! rest when `compress` is on.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// lumberjack's `backupTimeFormat` ("2006-01-02T15-04-05.000").
const BACKUP_TIME_LEN: usize = "2006-01-02T15-04-05.000".len();
const COMPRESS_SUFFIX: &str = ".gz";
/// lumberjack's defaultMaxSize, in MB, when `maxsize` is 0.
const DEFAULT_MAX_SIZE: i64 = 100;
const MEGABYTE: i64 = 1024 * 1024;
/// `maxage` is in days of 24 hours.
const DAY_MILLIS: i64 = 24 * 3600 * 1000;

/// lumberjack's settings (`--log-rotation-config-json`): Go ints, taken as
/// given (a negative `maxsize` refuses every write, as lumberjack does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RotationConfig {
    pub max_size: i64,
    pub max_age: i64,
    pub max_backups: i64,
    pub local_time: bool,
    pub compress: bool,
}

/// Where "now" comes from: tests turn the clock.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// lumberjack's Logger: the current file is always `filename`.
pub(crate) struct RotatingFile {
    filename: PathBuf,
    config: RotationConfig,
    /// Bytes per `maxsize` unit: a MiB, smaller in tests.
    megabyte: i64,
    clock: Clock,
    size: i64,
    file: Option<File>,
    mill: Option<mpsc::SyncSender<()>>,
    /// Tests mill on the writing thread, so that they see its result.
    mill_inline: bool,
}

impl RotatingFile {
    pub(crate) fn new(filename: PathBuf, config: RotationConfig) -> RotatingFile {
        RotatingFile {
            filename,
            config,
            megabyte: MEGABYTE,
            clock: Arc::new(SystemTime::now),
            size: 0,
            file: None,
            mill: None,
            mill_inline: false,
        }
    }

    /// A file whose `maxsize` unit is `megabyte` bytes, on `clock`, milled
    /// on the writing thread.
    #[cfg(test)]
    fn for_test(
        filename: PathBuf,
        config: RotationConfig,
        megabyte: i64,
        clock: Clock,
    ) -> RotatingFile {
        RotatingFile {
            megabyte,
            clock,
            mill_inline: true,
            ..RotatingFile::new(filename, config)
        }
    }

    /// lumberjack's `max()`: the largest the file may grow, in bytes.
    fn max(&self) -> i64 {
        let units = if self.config.max_size == 0 {
            DEFAULT_MAX_SIZE
        } else {
            self.config.max_size
        };
        units.saturating_mul(self.megabyte)
    }

    fn open_existing_or_new(&mut self, write_len: i64) -> io::Result<()> {
        self.mill();
        let info = match fs::metadata(&self.filename) {
            Ok(info) => info,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return self.open_new(),
            Err(e) => {
                return Err(error(format!(
                    "error getting log file info: {}",
                    go_error(&e)
                )))
            }
        };
        if (info.len() as i64).saturating_add(write_len) >= self.max() {
            return self.rotate();
        }
        match OpenOptions::new().append(true).open(&self.filename) {
            Ok(file) => {
                self.file = Some(file);
                self.size = info.len() as i64;
                Ok(())
            }
            // as lumberjack: an old file we cannot open is replaced
            Err(_) => self.open_new(),
        }
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        self.open_new()?;
        self.mill();
        Ok(())
    }

    /// Moves the current file aside (keeping its mode and owner for the
    /// new one) and opens a new, empty one.
    fn open_new(&mut self) -> io::Result<()> {
        let dir = dir_of(&self.filename);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o744)
            .create(&dir)
            .map_err(|e| {
                error(format!(
                    "can't make directories for new logfile: {}",
                    go_error(&e)
                ))
            })?;
        let mut mode = 0o644;
        if let Ok(info) = fs::metadata(&self.filename) {
            mode = info.permissions().mode() & 0o7777;
            let backup = backup_name(&self.filename, (self.clock)(), self.config.local_time);
            fs::rename(&self.filename, &backup)
                .map_err(|e| error(format!("can't rename log file: {}", go_error(&e))))?;
            chown_like(&self.filename, &info, mode)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(mode)
            .open(&self.filename)
            .map_err(|e| error(format!("can't open new logfile: {}", go_error(&e))))?;
        self.file = Some(file);
        self.size = 0;
        Ok(())
    }

    /// Starts the mill (once) and asks it for a pass; a pass already asked
    /// for covers this one.
    fn mill(&mut self) {
        if self.mill_inline {
            let _ = mill_once(&self.filename, &self.config, &self.clock);
            return;
        }
        if self.mill.is_none() {
            let (tx, rx) = mpsc::sync_channel::<()>(1);
            let (filename, config, clock) = (
                self.filename.clone(),
                self.config.clone(),
                self.clock.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name("log-mill".into())
                .spawn(move || {
                    while rx.recv().is_ok() {
                        // as lumberjack: nowhere to report a failure
                        let _ = mill_once(&filename, &config, &clock);
                    }
                });
            if spawned.is_err() {
                return;
            }
            self.mill = Some(tx);
        }
        if let Some(tx) = &self.mill {
            let _ = tx.try_send(());
        }
    }
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let write_len = buf.len() as i64;
        let max = self.max();
        if write_len > max {
            return Err(error(format!(
                "write length {write_len} exceeds maximum file size {max}"
            )));
        }
        if self.file.is_none() {
            self.open_existing_or_new(write_len)?;
        }
        if self.size + write_len > max {
            self.rotate()?;
        }
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| error("log file not open".into()))?;
        let n = file.write(buf)?;
        self.size += n as i64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn error(text: String) -> io::Error {
    io::Error::other(text)
}

/// An OS error in Go's words ("no such file or directory").
pub(crate) fn go_error(e: &io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// lumberjack's chown: the new file is created with the old one's owner.
fn chown_like(name: &Path, old: &fs::Metadata, mode: u32) -> io::Result<()> {
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(mode)
        .open(name)?;
    std::os::unix::fs::chown(name, Some(old.uid()), Some(old.gid()))
}

/// Go's filepath.Dir.
fn dir_of(name: &Path) -> PathBuf {
    match name.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Go's filepath.Base split by filepath.Ext: (`name`, `.log`); the
/// extension is from the last dot of the base name, `.log` included.
fn prefix_and_ext(name: &Path) -> (String, String) {
    let base = name
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    match base.rfind('.') {
        Some(dot) => (base[..dot].to_string(), base[dot..].to_string()),
        None => (base, String::new()),
    }
}

/// `dir/name-2006-01-02T15-04-05.000.ext` at `now`.
fn backup_name(name: &Path, now: SystemTime, local: bool) -> PathBuf {
    let (prefix, ext) = prefix_and_ext(name);
    dir_of(name).join(format!("{prefix}-{}{ext}", backup_time(now, local)))
}

/// `now` as lumberjack's backupTimeFormat, in UTC or local time.
fn backup_time(now: SystemTime, local: bool) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as libc::time_t;
    // SAFETY: tm is plain data, filled by gmtime_r/localtime_r from secs.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let filled = unsafe {
        if local {
            libc::localtime_r(&secs, &mut tm)
        } else {
            libc::gmtime_r(&secs, &mut tm)
        }
    };
    if filled.is_null() {
        return "1970-01-01T00-00-00.000".into();
    }
    format!(
        "{:04}-{:02}-{:02}T{:02}-{:02}-{:02}.{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        since.subsec_millis()
    )
}

/// The time a backup's name encodes, as Go's time.Parse reads the
/// format (as UTC): milliseconds since the epoch; None for a name that
/// is not a backup's.
fn time_from_name(file: &str, prefix: &str, ext: &str) -> Option<i64> {
    let ts = file.strip_prefix(prefix)?.strip_suffix(ext)?;
    let b = ts.as_bytes();
    if b.len() != BACKUP_TIME_LEN {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = &ts[range];
        digits
            .bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| digits.parse().ok())
            .flatten()
    };
    let separators = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b'-'),
        (16, b'-'),
        (19, b'.'),
    ];
    if separators.iter().any(|&(at, c)| b[at] != c) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second, millis) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A backup file and the time in its name.
struct Backup {
    name: String,
    millis: i64,
}

/// lumberjack's oldLogFiles: the backups next to `filename`, newest first.
fn backups(filename: &Path) -> io::Result<Vec<Backup>> {
    let dir = dir_of(filename);
    let (prefix, ext) = prefix_and_ext(filename);
    let prefix = format!("{prefix}-");
    let gz_ext = format!("{ext}{COMPRESS_SUFFIX}");
    let mut found = Vec::new();
    let entries = fs::read_dir(&dir)
        .map_err(|e| error(format!("can't read log file directory: {}", go_error(&e))))?;
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let millis = time_from_name(&name, &prefix, &ext)
            .or_else(|| time_from_name(&name, &prefix, &gz_ext));
        if let Some(millis) = millis {
            found.push(Backup { name, millis });
        }
    }
    found.sort_by_key(|b| std::cmp::Reverse(b.millis));
    Ok(found)
}

/// lumberjack's millRunOnce: removes backups beyond `maxbackups` (a
/// backup and its .gz count once) and older than `maxage` days, then
/// compresses the rest when asked to.
fn mill_once(filename: &Path, config: &RotationConfig, clock: &Clock) -> io::Result<()> {
    if config.max_backups == 0 && config.max_age == 0 && !config.compress {
        return Ok(());
    }
    let mut files = backups(filename)?;
    let mut remove = Vec::new();
    if config.max_backups > 0 && (config.max_backups as usize) < files.len() {
        let mut preserved = std::collections::HashSet::new();
        let mut remaining = Vec::new();
        for f in files {
            let base = f.name.strip_suffix(COMPRESS_SUFFIX).unwrap_or(&f.name);
            preserved.insert(base.to_string());
            if preserved.len() as i64 > config.max_backups {
                remove.push(f);
            } else {
                remaining.push(f);
            }
        }
        files = remaining;
    }
    if config.max_age > 0 {
        let now = clock().duration_since(UNIX_EPOCH).unwrap_or_default();
        let cutoff =
            (now.as_millis() as i64).saturating_sub(config.max_age.saturating_mul(DAY_MILLIS));
        let (old, young): (Vec<Backup>, Vec<Backup>) =
            files.into_iter().partition(|f| f.millis < cutoff);
        remove.extend(old);
        files = young;
    }
    let dir = dir_of(filename);
    let mut result = Ok(());
    for f in remove {
        if let Err(e) = fs::remove_file(dir.join(&f.name)) {
            result = result.and(Err(e));
        }
    }
    if config.compress {
        for f in files.iter().filter(|f| !f.name.ends_with(COMPRESS_SUFFIX)) {
            let src = dir.join(&f.name);
            let dst = dir.join(format!("{}{COMPRESS_SUFFIX}", f.name));
            if let Err(e) = compress_log_file(&src, &dst) {
                result = result.and(Err(e));
            }
        }
    }
    result
}

/// lumberjack's compressLogFile: `src` gzipped into `dst` (mode and owner
/// kept), then removed; a failed attempt removes `dst`.
fn compress_log_file(src: &Path, dst: &Path) -> io::Result<()> {
    let mut input =
        File::open(src).map_err(|e| error(format!("failed to open log file: {}", go_error(&e))))?;
    let info = input
        .metadata()
        .map_err(|e| error(format!("failed to stat log file: {}", go_error(&e))))?;
    let mode = info.permissions().mode() & 0o7777;
    chown_like(dst, &info, mode).map_err(|e| {
        error(format!(
            "failed to chown compressed log file: {}",
            go_error(&e)
        ))
    })?;
    let output = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(mode)
        .open(dst)
        .map_err(|e| {
            error(format!(
                "failed to open compressed log file: {}",
                go_error(&e)
            ))
        })?;
    let compressed = (|| {
        let mut gz = flate2::write::GzEncoder::new(output, flate2::Compression::default());
        io::copy(&mut input, &mut gz)?;
        gz.finish().map(drop)
    })();
    if let Err(e) = compressed {
        let _ = fs::remove_file(dst);
        return Err(error(format!(
            "failed to compress log file: {}",
            go_error(&e)
        )));
    }
    fs::remove_file(src)
}

#[cfg(test)]
mod tests;
