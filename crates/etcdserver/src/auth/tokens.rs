//! Auth tokens (etcd's TokenProvider): `--auth-token simple` (the default)
//! or `jwt,…`.
//!
//! A simple token is `<16 random letters>.<raft index>`: the member that
//! checked the password proposes the letters through raft, and every member
//! registers the token when it applies that index, so the token is valid on
//! all of them (a member that has not applied the index yet waits for it).
//! Each member keeps its own TTL (`--auth-token-ttl`), reset on every use;
//! tokens live in memory only and are gone after a restart. A JWT carries
//! the user name and auth revision signed, and is checked by signature and
//! expiry alone.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use api::rpctypes::{self, EtcdError};
use parking_lot::Mutex;

use super::jwt::JwtTokens;

/// Letters of a simple token's random part (etcd's defaultSimpleTokenLength).
const SIMPLE_TOKEN_LENGTH: usize = 16;
const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// What `--auth-token` asked for.
pub enum TokenProvider {
    Simple(SimpleTokens),
    Jwt(Box<JwtTokens>),
}

/// Why `--auth-token` was refused (etcd: "auth: invalid auth options").
#[derive(Debug)]
pub struct InvalidOptions(pub String);

impl std::fmt::Display for InvalidOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "auth: invalid auth options ({})", self.0)
    }
}

impl TokenProvider {
    /// etcd's NewTokenProvider: `simple`, or `jwt` with `key=value`
    /// options, comma separated; a repeated or malformed option refuses.
    pub fn new(spec: &str, simple_ttl: Duration) -> Result<TokenProvider, InvalidOptions> {
        let mut parts = spec.split(',');
        let kind = parts.next().unwrap_or_default();
        let mut options = BTreeMap::new();
        for option in parts {
            let pair: Vec<&str> = option.split('=').collect();
            if pair.len() != 2 {
                return Err(InvalidOptions(format!("malformed option {option:?}")));
            }
            if options
                .insert(pair[0].to_string(), pair[1].to_string())
                .is_some()
            {
                return Err(InvalidOptions(format!("option {:?} given twice", pair[0])));
            }
        }
        match kind {
            "simple" => {
                tracing::warn!("simple token is not cryptographically signed");
                Ok(TokenProvider::Simple(SimpleTokens::new(simple_ttl)))
            }
            "jwt" => JwtTokens::new(&options)
                .map(|jwt| TokenProvider::Jwt(Box::new(jwt)))
                .map_err(InvalidOptions),
            other => Err(InvalidOptions(format!("unknown token type {other:?}"))),
        }
    }

    /// The random part a simple token is proposed with (empty for JWT,
    /// which signs at apply instead).
    pub fn prefix(&self) -> String {
        match self {
            TokenProvider::Simple(_) => random_letters(SIMPLE_TOKEN_LENGTH),
            TokenProvider::Jwt(_) => String::new(),
        }
    }

    /// The token of a successful Authenticate, applied at raft `index`.
    pub fn assign(
        &self,
        username: &str,
        revision: u64,
        prefix: &str,
        index: u64,
    ) -> Result<String, EtcdError> {
        match self {
            TokenProvider::Simple(tokens) => {
                if prefix.is_empty() {
                    // A proposal without the random part (a JWT member
                    // proposed it): etcd refuses it the same way.
                    return Err(rpctypes::INVALID_AUTH_TOKEN);
                }
                Ok(tokens.assign(username, prefix, index))
            }
            TokenProvider::Jwt(jwt) => jwt.assign(username, revision),
        }
    }

    /// Forgets every token (auth disabled).
    pub fn clear(&self) {
        if let TokenProvider::Simple(tokens) = self {
            tokens.tokens.lock().clear();
        }
    }

    /// Forgets `username`'s tokens (the user was deleted or its password
    /// changed). JWTs stay valid until they expire, as in etcd.
    pub fn invalidate_user(&self, username: &str) {
        if let TokenProvider::Simple(tokens) = self {
            tokens.tokens.lock().retain(|_, t| t.username != username);
        }
    }
}

struct SimpleToken {
    username: String,
    expires: Instant,
}

/// Registered simple tokens and their per-member TTL.
pub struct SimpleTokens {
    ttl: Duration,
    tokens: Mutex<HashMap<String, SimpleToken>>,
}

impl SimpleTokens {
    fn new(ttl: Duration) -> SimpleTokens {
        SimpleTokens {
            ttl,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    fn assign(&self, username: &str, prefix: &str, index: u64) -> String {
        let token = format!("{prefix}.{index}");
        let now = Instant::now();
        let mut tokens = self.tokens.lock();
        // Expired tokens go as new ones come: the map holds only live ones.
        tokens.retain(|_, t| t.expires > now);
        tokens.insert(
            token.clone(),
            SimpleToken {
                username: username.to_string(),
                expires: now + self.ttl,
            },
        );
        token
    }

    /// The user of a registered, unexpired token; its TTL starts over.
    pub fn user(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut tokens = self.tokens.lock();
        let entry = tokens.get_mut(token)?;
        if entry.expires <= now {
            tokens.remove(token);
            return None;
        }
        entry.expires = now + self.ttl;
        Some(entry.username.clone())
    }
}

/// The raft index a simple token was registered at, if it is one.
pub fn simple_token_index(token: &str) -> Option<u64> {
    let (prefix, index) = token.split_once('.')?;
    if index.contains('.') || prefix.is_empty() {
        return None;
    }
    index.parse().ok()
}

fn random_letters(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    if getrandom::getrandom(&mut bytes).is_err() {
        // No system randomness: fall back to the process's PRNG (seeded
        // from the clock and address space), never to a fixed string.
        bytes.iter_mut().for_each(|b| *b = fastrand::u8(..));
    }
    bytes
        .iter()
        .map(|b| LETTERS[*b as usize % LETTERS.len()] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_tokens_expire_unless_used_and_go_with_their_user() {
        let tokens = SimpleTokens::new(Duration::from_millis(200));
        let a = tokens.assign("alice", "abcdefghijklmnop", 7);
        assert_eq!(a, "abcdefghijklmnop.7");
        assert_eq!(simple_token_index(&a), Some(7));
        assert_eq!(tokens.user(&a).as_deref(), Some("alice"));
        std::thread::sleep(Duration::from_millis(120));
        assert!(tokens.user(&a).is_some(), "use resets the TTL");
        std::thread::sleep(Duration::from_millis(120));
        assert!(tokens.user(&a).is_some());
        std::thread::sleep(Duration::from_millis(250));
        assert!(tokens.user(&a).is_none(), "expired");

        let provider = TokenProvider::Simple(tokens);
        let b = provider.assign("bob", 1, "qwertyuiopasdfgh", 9).unwrap();
        provider.invalidate_user("bob");
        let TokenProvider::Simple(tokens) = &provider else {
            unreachable!()
        };
        assert!(tokens.user(&b).is_none());
    }

    #[test]
    fn prefixes_are_random_letters_and_options_are_etcds() {
        let p = TokenProvider::new("simple", Duration::from_secs(300)).unwrap();
        let (a, b) = (p.prefix(), p.prefix());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_alphabetic()));
        assert_ne!(a, b);
        for bad in [
            "",
            "nope",
            "simple,x",
            "jwt,a=1,a=2",
            "jwt,sign-method=EdDSA",
        ] {
            assert!(
                TokenProvider::new(bad, Duration::from_secs(1)).is_err(),
                "{bad}"
            );
        }
        assert_eq!(simple_token_index("abc"), None);
        assert_eq!(simple_token_index("a.b.1"), None);
        assert_eq!(simple_token_index(".1"), None);
    }
}
