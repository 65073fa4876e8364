//! oxcd: an etcd v3 member. Takes etcd's flags (`--name`, `--data-dir`,
//! ...) and their `ETCD_*` environment variables, with etcd's defaults,
//! except that the default data dir is `${name}.oxcd` (the `oxcd` library:
//! `flags`, `config`); here: logging, signals and exit codes as etcd's.

use std::process::ExitCode;

use embed::logutil::{LogSettings, SetupError};
use oxcd::flags::{self, Level, Note, Parsed};

/// mimalloc instead of glibc's malloc: under 100 concurrent clients glibc's
/// arena locks showed up in profiles (futex waits in malloc/free), and
/// mimalloc's thread-local free lists avoid them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn print_version() {
    println!("oxcd Version: {}", env!("CARGO_PKG_VERSION"));
    println!("etcd API Version: {}", etcdserver::ETCD_VERSION);
    println!(
        "Git SHA: {}",
        option_env!("OXCD_GIT_SHA").unwrap_or("unknown")
    );
    println!(
        "OS/Arch: {}/{}",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
}

/// SIGTERM and SIGINT, installed before the member starts so that a signal
/// sent as soon as it is ready is never lost.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "terminated",
            _ = self.int.recv() => "interrupt",
        }
    }
}

/// Arms what OXCD_FAILPOINTS names (etcd's GOFAIL_FAILPOINTS) before
/// anything starts, so that a failpoint can fire during start-up too. A
/// wrong value is refused like a wrong flag: a test must not run believing
/// a failpoint is armed.
#[cfg(feature = "failpoints")]
fn arm_failpoints() -> Result<(), ExitCode> {
    match failpoint::arm_from_env() {
        Ok(names) => {
            for (name, action) in failpoint::list() {
                if names.contains(&name) {
                    tracing::warn!(failpoint = %name, %action, "failpoint armed from {}", failpoint::ENV);
                }
            }
            Ok(())
        }
        Err(e) => {
            eprintln!("oxcd: {}: {e}", failpoint::ENV);
            Err(ExitCode::from(2))
        }
    }
}

/// Logs a line etcd logs while reading its flags.
fn log_note(note: &Note) {
    let fields = note
        .fields
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    // tracing needs field names at compile time: the few shapes etcd uses
    match (note.level, note.fields.as_slice()) {
        (Level::Info, [(a, x), (b, y)]) if *a == "variable-name" && *b == "variable-value" => {
            tracing::info!("variable-name" = %x, "variable-value" = %y, "{}", note.msg)
        }
        (level, [(a, x)]) if *a == "environment-variable" => match level {
            Level::Warn => tracing::warn!("environment-variable" = %x, "{}", note.msg),
            Level::Info => tracing::info!("environment-variable" = %x, "{}", note.msg),
            Level::Fatal => tracing::error!("environment-variable" = %x, "{}", note.msg),
        },
        (Level::Warn, [(a, x), (b, y)]) if *a == "flag" && *b == "reason" => {
            tracing::warn!(flag = %x, reason = %y, "{}", note.msg)
        }
        (Level::Warn, [(a, x), (b, y)]) if *a == "key" && *b == "value" => {
            tracing::warn!(key = %x, value = %y, "{}", note.msg)
        }
        (Level::Info, [(a, x)]) if *a == "path" => tracing::info!(path = %x, "{}", note.msg),
        (Level::Warn, [(a, x)]) if *a == "flag-name" => {
            tracing::warn!("flag-name" = %x, "{}", note.msg)
        }
        (Level::Info, []) => tracing::info!("{}", note.msg),
        (Level::Warn, []) => tracing::warn!("{}", note.msg),
        (Level::Info, _) => tracing::info!(fields = %fields, "{}", note.msg),
        (Level::Warn, _) => tracing::warn!(fields = %fields, "{}", note.msg),
        (Level::Fatal, _) => tracing::error!(fields = %fields, "{}", note.msg),
    }
}

/// The config file's text; an error in Go's words (`open F: no such file
/// or directory`).
fn read_config_file(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| {
        let text = e.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        let mut chars = text.chars();
        let text = match chars.next() {
            Some(first) => first.to_lowercase().chain(chars).collect::<String>(),
            None => text.to_string(),
        };
        let op = if e.kind() == std::io::ErrorKind::IsADirectory {
            "read"
        } else {
            "open"
        };
        format!("{op} {path}: {text}")
    })
}

/// etcd's logging flags.
fn log_settings(flags: &flags::Flags) -> LogSettings {
    LogSettings {
        logger: flags.str("logger").to_string(),
        outputs: flags.list("log-outputs").to_vec(),
        level: flags.str("log-level").to_string(),
        enable_rotation: flags.bool("enable-log-rotation"),
        rotation_config_json: flags.str("log-rotation-config-json").to_string(),
    }
}

/// etcd's "failed to verify flags": logged, exit status 1.
fn refuse(error: &str) -> ExitCode {
    tracing::warn!(error = %error, "failed to verify flags");
    eprintln!("oxcd: {error}");
    ExitCode::FAILURE
}

/// Transparent huge pages off for this process. mimalloc asks for them
/// (madvise) on its arenas, and a 2 MiB page is resident as soon as one
/// byte of it is touched: after 100k puts, 90 of the 138 MB resident were
/// huge pages (14 of 30 MB idle). Without them the member kept 117 MB
/// (17 MB idle) at the same throughput. The flag applies to pages faulted
/// from now on, whichever call mapped them.
fn disable_transparent_huge_pages() {
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes plain integers and touches no
    // memory of ours; a kernel without it answers EINVAL, which changes
    // nothing.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, v3: the 16th option).
const MI_OPTION_PURGE_DELAY: std::os::raw::c_int = 15;

extern "C" {
    // mimalloc's C API, linked with the allocator (the Rust binding
    // declares it only under its `extended` feature).
    fn mi_option_set(option: std::os::raw::c_int, value: std::os::raw::c_long);
    fn mi_collect(force: bool);
}

/// While the member starts, freed memory goes back to the kernel at once.
/// mimalloc's default waits 1 s and purges only when some thread frees an
/// arena page again, so memory a start freed before the member idled
/// stayed resident: after a restart at 100k keys, 88 MB instead of 44.
fn purge_freed_memory_at_once() {
    // SAFETY: mimalloc's option setter takes plain integers; the option
    // index is checked against its default in the test below.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

/// Once it serves, how long memory freed back to mimalloc's arenas stays
/// committed before it goes back to the kernel (ms). At 0 every buffer
/// past a few hundred KiB, and every arena page emptied while a like one
/// was in use, was handed back and faulted in again on its next use: a
/// raft snapshot of 1.1 GB (a learner catching up) spent a fifth of the
/// leader's CPU and a seventh of the learner's in page faults, 5.0 s to
/// catch up against 4.0 s at 100 ms (leader CPU 3.2 -> 2.3 s, learner
/// 4.6 -> 3.8 s). A purge takes what has been freed since the last one,
/// so the delay is also how long memory is reused before it is given back.
const PURGE_DELAY_MS: std::os::raw::c_long = 100;

/// How often the `mem-purge` thread lets mimalloc purge what is due, which
/// it otherwise does only when some thread frees an arena page: memory
/// freed before the member idles goes back within the delay and a tick.
const PURGE_TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// How long after the member serves freed memory still goes back at once:
/// the start's own frees come just after, and a restart's were hundreds of
/// MB (the WAL's entries since the last snapshot, read into raft's log and
/// moved out of memory once found applied: 600 MB at 1.1 GB of 8 KiB
/// values), resident for the delay and a tick had the delay begun at once.
const START_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Set once the member stops: see [`keep_freed_memory`].
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Once the member stops, freed memory stays with the process, which exits
/// soon: purging it only delays the exit. The frees of a stop (redb's
/// cache, buffers) purged what was due, 15 ms of a 100 ms stop at 524,288
/// keys in perf, all of it `madvise` and the kernel's unmapping.
fn keep_freed_memory() {
    STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: as in purge_freed_memory_at_once; a negative delay is
    // mimalloc's "never purge".
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

/// Freed memory goes back to the kernel within [`PURGE_DELAY_MS`] and a
/// [`PURGE_TICK`], busy or idle, from `settle` on (at once until then).
fn purge_freed_memory_soon(settle: std::time::Duration) {
    // Without the thread (none could be had), memory goes on being purged
    // at once.
    let _ = std::thread::Builder::new()
        .name("mem-purge".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            std::thread::sleep(settle);
            // SAFETY: as in purge_freed_memory_at_once.
            unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
            if STOPPING.load(std::sync::atomic::Ordering::SeqCst) {
                // a stop began while this thread slept: it keeps its memory
                keep_freed_memory();
                return;
            }
            loop {
                std::thread::sleep(PURGE_TICK);
                // SAFETY: collects this thread's (empty) heap and purges
                // the arenas' ranges whose delay has passed; takes no
                // pointer.
                unsafe { mi_collect(false) }
            }
        });
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    purge_freed_memory_at_once();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let parsed = flags::parse(&args, &env);
    let flags = match parsed {
        Ok(Parsed::Help) => {
            println!("{}", flags::help_text(flags::specs()));
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Version) => {
            print_version();
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(flags)) => flags,
        Err(e) if e.usage => {
            // Go's flag package: the error, then the usage; exit status 2
            eprintln!("{}", e.message);
            eprintln!("{}", flags::USAGE);
            return ExitCode::from(2);
        }
        Err(e) => {
            embed::logutil::init_default();
            return refuse(&e.message);
        }
    };
    // etcd: a config file replaces every other flag and variable
    let flags = match flags.config_file() {
        None => flags,
        Some(path) => match read_config_file(path)
            .and_then(|text| oxcd::config_file::load(&flags, path, &text))
        {
            Ok(from_file) => Box::new(from_file),
            Err(e) => {
                embed::logutil::init_default();
                return refuse(&e);
            }
        },
    };
    // as etcd: what reading the variables found goes to its default
    // logger (stderr); the config file's line to the configured one
    let (loaded, notes): (Vec<&Note>, Vec<&Note>) = flags
        .notes
        .iter()
        .partition(|note| note.msg == oxcd::config_file::LOADED);
    let fatal = embed::logutil::with_default_logger(|| {
        notes.iter().find(|note| {
            log_note(note);
            note.level == Level::Fatal
        })
    });
    if let Some(note) = fatal {
        eprintln!("oxcd: {}", note.msg);
        return ExitCode::FAILURE;
    }
    let args: Vec<String> = std::env::args().collect();
    if let Err(e) = embed::logutil::setup(&log_settings(&flags)) {
        return match e {
            // etcd panics here: exit status 2
            SetupError::UnknownLevel(e) => {
                eprintln!("oxcd: {e}");
                ExitCode::from(2)
            }
            SetupError::Invalid(e) => {
                embed::logutil::init_default();
                tracing::info!(args = %embed::logutil::strings(&args), "Running: ");
                refuse(&e)
            }
        };
    }
    for note in loaded {
        log_note(note);
    }
    tracing::info!(args = %embed::logutil::strings(&args), "Running: ");
    #[cfg(feature = "failpoints")]
    if let Err(code) = arm_failpoints() {
        return code;
    }
    let (mut cfg, discovery_srv) = match oxcd::config_from(&flags) {
        Ok(config) => {
            for note in &config.notes {
                log_note(note);
            }
            (config.server, config.discovery_srv)
        }
        Err(e) => return refuse(&e),
    };
    // etcd asks DNS when it sets up the initial cluster, before anything
    // of the member exists; a failure is its "discovery failed"
    if let Some(discovery) = discovery_srv {
        if let Err(e) = discovery.bootstrap(&mut cfg, &srv::Resolver::system()) {
            tracing::warn!(error = %e, "failed to start etcd");
            tracing::error!(error = %e, "discovery failed");
            eprintln!("oxcd: {e}");
            return ExitCode::FAILURE;
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oxcd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let mut signals = match Signals::install() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("oxcd: cannot install signal handlers: {e}");
                return ExitCode::FAILURE;
            }
        };
        let member = match embed::start(cfg).await {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "failed to start etcd server");
                eprintln!("oxcd: {e}");
                return ExitCode::FAILURE;
            }
        };
        purge_freed_memory_soon(START_SETTLE);
        let fatal = tokio::select! {
            signal = signals.recv() => {
                tracing::info!(signal, "received signal; shutting down");
                None
            }
            cause = member.fatal() => Some(cause),
            // etcd: a removed member stops and exits with status 0
            _ = member.removed() => None,
        };
        keep_freed_memory();
        member.stop().await;
        match fatal {
            None => ExitCode::SUCCESS,
            Some(cause) => {
                // etcd's lg.Fatal: the cause is the last line, the exit code 1.
                tracing::error!(cause = %cause, "stopped on a fatal error; exiting");
                eprintln!("oxcd: {cause}");
                ExitCode::FAILURE
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn mi_option_get(option: std::os::raw::c_int) -> std::os::raw::c_long;
    }

    /// The option index is mimalloc's purge delay: its default is v3's
    /// 1000 ms (no other option defaults to that), and it takes ours;
    /// with the delay, memory freed goes back while the process idles.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: as in purge_freed_memory_at_once.
        let default = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(default, 1000);
        }
        purge_freed_memory_at_once();
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, 0);
        purge_freed_memory_soon(std::time::Duration::from_millis(200));
        // (at once until the settle time has passed)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) } != PURGE_DELAY_MS {
            assert!(
                std::time::Instant::now() < deadline,
                "the delay was not set"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // (one test: a second one setting the option could run first)
        freed_memory_goes_back_to_the_kernel_while_idle();
        freed_memory_stays_once_the_member_stops();
    }

    /// After [`keep_freed_memory`] nothing is purged: memory freed stays
    /// resident through several purge ticks.
    fn freed_memory_stays_once_the_member_stops() {
        const BLOCK: usize = 64 * 1024;
        const BLOCKS: usize = 4096; // 256 MiB
        keep_freed_memory();
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, -1);
        let blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|i| vec![i as u8 | 1; BLOCK]).collect();
        let held = testkit::vm_rss("self");
        drop(blocks);
        std::thread::sleep(PURGE_TICK * 5);
        let now = testkit::vm_rss("self");
        assert!(
            now + (BLOCK * BLOCKS) as u64 / 4 > held,
            "{now} B resident, {held} B with the blocks: freed memory went back"
        );
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, -1);
    }

    /// Memory freed while nothing else frees or allocates goes back to
    /// the kernel: the purge thread lets mimalloc purge it once due.
    fn freed_memory_goes_back_to_the_kernel_while_idle() {
        const BLOCK: usize = 64 * 1024;
        const BLOCKS: usize = 4096; // 256 MiB
        let blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|i| vec![i as u8 | 1; BLOCK]).collect();
        let held = testkit::vm_rss("self");
        assert!(held > (BLOCK * BLOCKS) as u64, "{held} B resident");
        drop(blocks);
        // (other tests of this binary may run meanwhile: a drop of most
        // of the 256 MiB is the sign)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let now = testkit::vm_rss("self");
            if now + (BLOCK * BLOCKS) as u64 * 3 / 4 < held {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{now} B still resident, {held} B with the blocks"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
