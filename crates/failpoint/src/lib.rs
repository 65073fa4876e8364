//! Failpoints: named places in the server where a test makes the member
//! crash, stall or take a wrong path on purpose, as etcd's gofail
//! failpoints do for etcd's robustness tests.
//!
//! # What it owns
//!
//! The registry (failpoint name → armed action), the parser of gofail's
//! action syntax, and [`fail_point!`], which a site calls. The catalogue of
//! every site is [`NAMES`]: arming any other name is refused, so that a typo
//! in a test cannot arm a failpoint that never fires.
//!
//! # What it never does
//!
//! Decide what a site does on `return`: the site says it (its closure).
//! It has no notion of the member, raft or the store.
//!
//! # Compiled in only on request
//!
//! The registry is small and always builds, but nothing reaches it unless
//! the crate holding a site enables its own `failpoints` feature (which
//! pulls this crate in: `failpoints = ["dep:failpoint"]`). Without it each
//! site is a macro that expands to nothing: no call, no atomic load, no
//! dependency. `oxcd`'s `failpoints` feature turns them all on; release
//! builds do not enable it.
//!
//! # Actions (gofail's terms)
//!
//! `[P%][K*]action`, with `action` one of:
//!
//! * `off`: disarmed (arming `off` removes the failpoint);
//! * `panic`: prints `failpoint <name> triggered: panic` to stderr and
//!   aborts the process right there, whatever thread or task runs the site
//!   (a crash: no unwinding, no destructor, no flush);
//! * `sleep(N)`: blocks the calling thread N milliseconds (`sleep(1s)`,
//!   `sleep(250ms)` and gofail's quoted `sleep("1s")` also read);
//! * `return` or `return(arg)`: the site's own alternative path, given
//!   `arg`; a site without one ignores it.
//!
//! `K*` triggers the action K times, then the failpoint is disarmed; `P%`
//! triggers it with probability P percent at each pass (a pass that does
//! not trigger uses up none of the K).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Every failpoint site, by name: etcd's gofail names where etcd has the
/// same site, ours otherwise. Where each one is, and what `return` does
/// there, is in docs/ARCHITECTURE.md ("Failpoints").
pub const NAMES: &[&str] = &[
    "raftBeforeSave",
    "raftAfterSave",
    "raftBeforeSaveSnap",
    "raftAfterSaveSnap",
    "raftBeforeApplySnap",
    "raftAfterApplySnap",
    "raftDuringSendSnapshot",
    "snapshotRecordsUnimplemented",
    "snapshotImageUnimplemented",
    "beforeCommit",
    "afterCommit",
    "compactBeforeCommitScheduledCompact",
    "compactAfterCommitScheduledCompact",
    "compactBeforeCommitBatch",
    "compactAfterCommitBatch",
    "defragBeforeCopy",
    "defragBeforeRename",
    "brokenLinearizableRead",
];

/// The environment variable read at start-up: `name=action;name=action`,
/// as etcd's GOFAIL_FAILPOINTS.
pub const ENV: &str = "OXCD_FAILPOINTS";

/// What an armed failpoint does when it triggers.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Off,
    Panic,
    Sleep(Duration),
    Return(Option<String>),
}

/// A parsed `[P%][K*]action`, with the text it was read from (listed back
/// as given).
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub percent: Option<f64>,
    pub count: Option<u64>,
    pub action: Action,
    pub text: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// gofail's words for a name no site has.
    Unknown(String),
    /// The action does not parse; says why.
    Parse(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unknown(name) => write!(f, "failpoint {name:?} does not exist"),
            Error::Parse(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {}

/// Reads `[P%][K*]action`.
pub fn parse(text: &str) -> Result<Spec, Error> {
    let trimmed = text.trim();
    let bad = |why: &str| Error::Parse(format!("bad failpoint action {trimmed:?}: {why}"));
    // The prefixes stand before the action's argument, which may hold
    // anything, '%' and '*' too.
    let paren = trimmed.find('(').unwrap_or(trimmed.len());
    let (mut prefixes, action_start) = match trimmed[..paren].rfind(['%', '*']) {
        Some(at) => (&trimmed[..at + 1], at + 1),
        None => ("", 0),
    };
    let mut percent = None;
    if let Some((p, after)) = prefixes.split_once('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad("P% needs a number"))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(bad("P% must be between 0 and 100"));
        }
        percent = Some(p);
        prefixes = after;
    }
    let mut count = None;
    if let Some((k, after)) = prefixes.split_once('*') {
        let k: u64 = k
            .trim()
            .parse()
            .map_err(|_| bad("K* needs a whole number"))?;
        if k == 0 {
            return Err(bad("K* must be at least 1"));
        }
        count = Some(k);
        prefixes = after;
    }
    if !prefixes.trim().is_empty() {
        return Err(bad("prefixes are P% then K*"));
    }
    let rest = &trimmed[action_start..];
    let rest = rest.trim();
    let (word, arg) = match rest.split_once('(') {
        Some((word, tail)) => {
            let arg = tail
                .strip_suffix(')')
                .ok_or_else(|| bad("unclosed '('"))?
                .trim();
            (word.trim(), Some(arg.trim_matches('"')))
        }
        None => (rest, None),
    };
    let action = match (word, arg) {
        ("off", None) => Action::Off,
        ("panic", None) => Action::Panic,
        ("sleep", Some(arg)) => Action::Sleep(parse_duration(arg).ok_or_else(|| {
            bad("sleep takes milliseconds, or a number with ms or s: sleep(200), sleep(1s)")
        })?),
        ("return", None) => Action::Return(None),
        ("return", Some(arg)) => Action::Return(Some(arg.to_string())),
        _ => return Err(bad("expected off, panic, sleep(N) or return[(arg)]")),
    };
    Ok(Spec {
        percent,
        count,
        action,
        text: trimmed.to_string(),
    })
}

/// `200` (milliseconds, gofail's unit), `200ms`, `2s`.
fn parse_duration(arg: &str) -> Option<Duration> {
    let (number, unit) = match arg.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => arg.split_at(at),
        None => (arg, "ms"),
    };
    let number: u64 = number.parse().ok()?;
    match unit.trim() {
        "ms" => Some(Duration::from_millis(number)),
        "s" => Some(Duration::from_secs(number)),
        _ => None,
    }
}

struct Armed {
    spec: Spec,
    /// Triggers left for `K*`.
    remaining: Option<u64>,
}

/// Armed failpoints. The process has one ([`eval`], [`arm`], ...); tests
/// make their own.
pub struct Registry {
    known: &'static [&'static str],
    armed: Mutex<BTreeMap<String, Armed>>,
    /// How many failpoints are armed: a site passes with one atomic load
    /// when none is (a build with failpoints can still be benchmarked).
    armed_count: AtomicUsize,
}

static GLOBAL: Registry = Registry::new(NAMES);

impl Registry {
    /// A registry that arms only the names in `known`.
    pub const fn new(known: &'static [&'static str]) -> Registry {
        Registry {
            known,
            armed: Mutex::new(BTreeMap::new()),
            armed_count: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Armed>> {
        // a site that aborts never unwinds, and nothing else panics while
        // holding the lock: a poisoned map is still whole
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish_count(&self, armed: &BTreeMap<String, Armed>) {
        self.armed_count.store(armed.len(), Ordering::Release);
    }

    /// Arms `name` with `action` (replacing what it had); `off` disarms.
    pub fn arm(&self, name: &str, action: &str) -> Result<(), Error> {
        if !self.known.contains(&name) {
            return Err(Error::Unknown(name.to_string()));
        }
        let spec = parse(action)?;
        let mut armed = self.lock();
        if spec.action == Action::Off {
            armed.remove(name);
        } else {
            let remaining = spec.count;
            armed.insert(name.to_string(), Armed { spec, remaining });
        }
        self.publish_count(&armed);
        Ok(())
    }

    /// Arms every `name=action` of `specs` (separated by `;`, as
    /// GOFAIL_FAILPOINTS), or none of them if one is wrong.
    pub fn arm_all(&self, specs: &str) -> Result<Vec<String>, Error> {
        let mut parsed = Vec::new();
        for term in specs.split(';').map(str::trim).filter(|t| !t.is_empty()) {
            let (name, action) = term.split_once('=').ok_or_else(|| {
                Error::Parse(format!("bad failpoint {term:?}: expected name=action"))
            })?;
            let name = name.trim();
            if !self.known.contains(&name) {
                return Err(Error::Unknown(name.to_string()));
            }
            parse(action)?;
            parsed.push((name, action));
        }
        for (name, action) in &parsed {
            self.arm(name, action)?;
        }
        Ok(parsed
            .into_iter()
            .map(|(name, _)| name.to_string())
            .collect())
    }

    /// Disarms `name`; false if it was not armed.
    pub fn disarm(&self, name: &str) -> bool {
        let mut armed = self.lock();
        let was = armed.remove(name).is_some();
        self.publish_count(&armed);
        was
    }

    /// `(name, action as given)` of every armed failpoint, by name.
    pub fn list(&self) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .map(|(name, armed)| (name.clone(), armed.spec.text.clone()))
            .collect()
    }

    /// The action `name` is armed with, as given.
    pub fn get(&self, name: &str) -> Option<String> {
        self.lock().get(name).map(|armed| armed.spec.text.clone())
    }

    /// What `name` does on this pass, counted against its `K*`, without
    /// carrying it out.
    pub fn trigger(&self, name: &str) -> Option<Action> {
        if self.armed_count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut armed = self.lock();
        let entry = armed.get_mut(name)?;
        if let Some(percent) = entry.spec.percent {
            if fastrand::f64() * 100.0 >= percent {
                return None;
            }
        }
        let action = entry.spec.action.clone();
        if let Some(remaining) = &mut entry.remaining {
            *remaining -= 1;
            if *remaining == 0 {
                armed.remove(name);
                self.publish_count(&armed);
            }
        }
        Some(action)
    }

    /// [`Registry::trigger`], then carries out `panic` and `sleep` (outside
    /// the lock: a sleeping site must not hold up arming and listing).
    /// Some(action) when something triggered that did not end the process.
    pub fn eval(&self, name: &str) -> Option<Action> {
        match self.trigger(name)? {
            Action::Off => None,
            Action::Panic => {
                eprintln!("failpoint {name} triggered: panic");
                std::process::abort()
            }
            Action::Sleep(duration) => {
                std::thread::sleep(duration);
                Some(Action::Sleep(duration))
            }
            action @ Action::Return(_) => Some(action),
        }
    }
}

/// The process's registry: see [`Registry::eval`]. A site's name must be
/// in [`NAMES`].
pub fn eval(name: &str) -> Option<Action> {
    debug_assert!(NAMES.contains(&name), "failpoint {name} is not in NAMES");
    GLOBAL.eval(name)
}

/// Arms a failpoint of the process: see [`Registry::arm`].
pub fn arm(name: &str, action: &str) -> Result<(), Error> {
    GLOBAL.arm(name, action)
}

/// Disarms a failpoint of the process: see [`Registry::disarm`].
pub fn disarm(name: &str) -> bool {
    GLOBAL.disarm(name)
}

/// The process's armed failpoints: see [`Registry::list`].
pub fn list() -> Vec<(String, String)> {
    GLOBAL.list()
}

/// One armed failpoint of the process: see [`Registry::get`].
pub fn get(name: &str) -> Option<String> {
    GLOBAL.get(name)
}

/// Arms what [`ENV`] names; the names armed (none if it is unset).
pub fn arm_from_env() -> Result<Vec<String>, Error> {
    match std::env::var(ENV) {
        Ok(specs) => GLOBAL.arm_all(&specs),
        Err(_) => Ok(Vec::new()),
    }
}

/// A failpoint site: `fail_point!("name")` sleeps or aborts when armed so;
/// `fail_point!("name", |arg| value)` also returns `value` from the
/// enclosing function when armed with `return(arg)` (`arg`: the
/// `Option<&str>` given). A crate calls it through its own shim, which
/// expands to nothing without the crate's `failpoints` feature.
#[macro_export]
macro_rules! fail_point {
    ($name:expr) => {{
        let _ = $crate::eval($name);
    }};
    ($name:expr, $on_return:expr) => {{
        if let ::std::option::Option::Some($crate::Action::Return(arg)) = $crate::eval($name) {
            return ($on_return)(arg.as_deref());
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_NAMES: &[&str] = &["a", "b", "c"];

    #[test]
    fn parses_gofail_terms() {
        let spec = parse("panic").unwrap();
        assert_eq!(
            (spec.percent, spec.count, spec.action),
            (None, None, Action::Panic)
        );
        assert_eq!(
            parse("sleep(200)").unwrap().action,
            Action::Sleep(Duration::from_millis(200))
        );
        assert_eq!(
            parse("sleep(\"1s\")").unwrap().action,
            Action::Sleep(Duration::from_secs(1))
        );
        assert_eq!(
            parse(" sleep(250ms) ").unwrap().action,
            Action::Sleep(Duration::from_millis(250))
        );
        assert_eq!(parse("return").unwrap().action, Action::Return(None));
        assert_eq!(
            parse("return(\"x\")").unwrap().action,
            Action::Return(Some("x".into()))
        );
        assert_eq!(
            parse("2*return(a*b%c)").unwrap().action,
            Action::Return(Some("a*b%c".into()))
        );
        assert_eq!(parse("off").unwrap().action, Action::Off);
        let spec = parse("25.5%3*return").unwrap();
        assert_eq!(
            (spec.percent, spec.count, spec.action, spec.text.as_str()),
            (Some(25.5), Some(3), Action::Return(None), "25.5%3*return")
        );
    }

    #[test]
    fn refuses_what_gofail_would_not_run() {
        for bad in [
            "",
            "crash",
            "sleep",
            "sleep(x)",
            "sleep(1h)",
            "sleep(5",
            "panic(1)",
            "0*panic",
            "x*panic",
            "101%panic",
            "return->panic",
            "2*50%return",
            "2*3*return",
        ] {
            assert!(matches!(parse(bad), Err(Error::Parse(_))), "{bad:?} parsed");
        }
    }

    #[test]
    fn arms_only_known_names_and_lists_them_as_given() {
        let registry = Registry::new(TEST_NAMES);
        assert_eq!(
            registry.arm("nope", "panic"),
            Err(Error::Unknown("nope".into()))
        );
        registry.arm("b", "sleep(5)").unwrap();
        registry.arm("a", "2*return(x)").unwrap();
        assert!(registry.arm("c", "bogus").is_err());
        assert_eq!(
            registry.list(),
            vec![
                ("a".to_string(), "2*return(x)".to_string()),
                ("b".to_string(), "sleep(5)".to_string())
            ]
        );
        assert_eq!(registry.get("b").as_deref(), Some("sleep(5)"));
        assert_eq!(registry.get("c"), None);
    }

    #[test]
    fn count_triggers_k_times_then_disarms() {
        let registry = Registry::new(TEST_NAMES);
        registry.arm("a", "2*return(x)").unwrap();
        for _ in 0..2 {
            assert_eq!(registry.eval("a"), Some(Action::Return(Some("x".into()))));
        }
        assert_eq!(registry.eval("a"), None);
        assert!(registry.list().is_empty());
        assert_eq!(registry.armed_count.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn off_and_disarm_stop_a_failpoint() {
        let registry = Registry::new(TEST_NAMES);
        registry.arm("a", "return").unwrap();
        registry.arm("b", "return").unwrap();
        assert_eq!(registry.eval("a"), Some(Action::Return(None)));
        registry.arm("a", "off").unwrap();
        assert_eq!(registry.eval("a"), None);
        assert!(registry.disarm("b"));
        assert!(!registry.disarm("b"));
        assert_eq!(registry.eval("b"), None);
        assert_eq!(registry.armed_count.load(Ordering::Relaxed), 0);
        // unarmed names pass, armed or not elsewhere
        assert_eq!(registry.eval("c"), None);
    }

    #[test]
    fn sleep_blocks_the_calling_thread() {
        let registry = Registry::new(TEST_NAMES);
        registry.arm("a", "1*sleep(30)").unwrap();
        let started = std::time::Instant::now();
        assert_eq!(
            registry.eval("a"),
            Some(Action::Sleep(Duration::from_millis(30)))
        );
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(registry.eval("a"), None);
    }

    #[test]
    fn percent_triggers_about_that_often_and_counts_only_triggers() {
        let registry = Registry::new(TEST_NAMES);
        registry.arm("a", "0%return").unwrap();
        assert!((0..1000).all(|_| registry.eval("a").is_none()));
        registry.arm("a", "100%3*return").unwrap();
        assert_eq!((0..10).filter(|_| registry.eval("a").is_some()).count(), 3);
        registry.arm("b", "50%return").unwrap();
        let hits = (0..4000).filter(|_| registry.eval("b").is_some()).count();
        assert!((1600..2400).contains(&hits), "{hits} of 4000 at 50%");
    }

    #[test]
    fn arm_all_reads_the_env_format_all_or_nothing() {
        let registry = Registry::new(TEST_NAMES);
        assert_eq!(
            registry.arm_all("a=panic; b=sleep(10);").unwrap(),
            vec!["a".to_string(), "b".to_string()]
        );
        assert_eq!(registry.list().len(), 2);
        let registry = Registry::new(TEST_NAMES);
        assert!(registry.arm_all("a=panic;b=bogus").is_err());
        assert!(registry.arm_all("a=panic;zz=panic").is_err());
        assert!(registry.arm_all("a").is_err());
        assert!(registry.list().is_empty());
    }

    #[test]
    fn the_macro_form_compiles_against_the_process_registry() {
        fn site() -> Result<(), String> {
            crate::fail_point!("brokenLinearizableRead", |arg: Option<&str>| Err(arg
                .unwrap_or("returned")
                .to_string()));
            crate::fail_point!("raftBeforeSave");
            Ok(())
        }
        // nothing is armed in this test binary's process registry but here
        assert_eq!(site(), Ok(()));
        arm("brokenLinearizableRead", "1*return").unwrap();
        assert_eq!(site(), Err("returned".to_string()));
        assert_eq!(site(), Ok(()));
        assert!(list().is_empty());
    }
}
