//! `--user name[:password]` and `--password`: who the benchmark runs as.
//!
//! As clientv3 does for etcd's benchmark, each connection authenticates once
//! (Auth.Authenticate on its own endpoint) and every request on it then
//! carries the token as gRPC metadata `token`, added by [`TokenInterceptor`]:
//! the server checks a token per request, never a password (no bcrypt in the
//! measured path).
//!
//! Deliberately not done: clientv3 re-authenticates and retries a request
//! refused with "etcdserver: invalid auth token". A simple token's TTL is
//! renewed by every request that uses it, so a running benchmark keeps it;
//! only a JWT outliving its TTL would show as counted errors.

use std::io::{BufRead, IsTerminal, Write};

use api::etcdserverpb::auth_client::AuthClient;
use api::etcdserverpb::AuthenticateRequest;
use api::rpctypes;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;

/// The metadata key etcd reads the token from (clientv3's `rpctypes.TokenFieldNameGRPC`).
pub const TOKEN_METADATA_KEY: &str = "token";

/// A user name and its password. Debug output hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The credentials the flags give, as etcdctl reads them (etcd's benchmark
/// has only `--user`; `--password` is etcdctl's): with `--password`, `--user`
/// is the whole name; otherwise `--user` splits at its first colon, and a
/// name alone gets its password from `ask_password` (etcd prompts).
///
/// `None` when there is no user, or when the password is empty: clientv3
/// authenticates only with both, and sends requests without a token otherwise.
pub fn credentials_from_flags(
    user: &str,
    password: &str,
    ask_password: impl FnOnce() -> Result<String, String>,
) -> Result<Option<Credentials>, String> {
    if user.is_empty() {
        if !password.is_empty() {
            return Err("--password needs --user".into());
        }
        return Ok(None);
    }
    let credentials = if !password.is_empty() {
        Credentials {
            name: user.to_string(),
            password: password.to_string(),
        }
    } else if let Some((name, password)) = user.split_once(':') {
        Credentials {
            name: name.to_string(),
            password: password.to_string(),
        }
    } else {
        let password = ask_password().map_err(|e| format!("bad user information: {user} {e}"))?;
        Credentials {
            name: user.to_string(),
            password,
        }
    };
    Ok((!credentials.name.is_empty() && !credentials.password.is_empty()).then_some(credentials))
}

/// etcd prompts "Password: " and reads a line from stdin with the echo off.
/// The prompt goes to stderr so that `--json` output stays one object; from
/// a pipe (`echo pw | oxbench --user bench …`) the line is read as is.
pub fn ask_password() -> Result<String, String> {
    let stdin = std::io::stdin();
    let terminal = stdin.is_terminal();
    eprint!("Password: ");
    let _ = std::io::stderr().flush();
    // As etcd's speakeasy does: `stty` switches the terminal's echo.
    let set_echo = |on: bool| {
        let _ = std::process::Command::new("stty")
            .arg(if on { "echo" } else { "-echo" })
            .stdin(std::process::Stdio::inherit())
            .status();
    };
    if terminal {
        set_echo(false);
    }
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    if terminal {
        set_echo(true);
        eprintln!();
    }
    match read {
        Ok(0) => Err("no password on stdin (give --user name:password or --password)".into()),
        Ok(_) => Ok(line.trim_end_matches(['\r', '\n']).to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Adds the connection's token to every request, unary or streaming.
#[derive(Clone, Debug, Default)]
pub struct TokenInterceptor {
    token: Option<AsciiMetadataValue>,
}

impl TokenInterceptor {
    pub fn new(token: Option<AsciiMetadataValue>) -> Self {
        TokenInterceptor { token }
    }
}

impl Interceptor for TokenInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert(TOKEN_METADATA_KEY, token.clone());
        }
        Ok(request)
    }
}

/// One connection as every workload uses it: a channel whose requests carry
/// the token it authenticated with, if any.
pub type Connection = InterceptedService<Channel, TokenInterceptor>;

/// Authenticate on `channel`: its token, or `None` when the server has auth
/// disabled (clientv3 goes on without a token then).
pub async fn authenticate(
    channel: &Channel,
    credentials: &Credentials,
) -> Result<Option<AsciiMetadataValue>, tonic::Status> {
    let response = AuthClient::new(channel.clone())
        .authenticate(AuthenticateRequest {
            name: credentials.name.clone(),
            password: credentials.password.clone(),
        })
        .await;
    match response {
        Ok(response) => {
            let token = response.into_inner().token;
            AsciiMetadataValue::try_from(token.as_str())
                .map(Some)
                .map_err(|_| tonic::Status::internal("the server's auth token is not ASCII"))
        }
        Err(status) if status.message() == rpctypes::AUTH_NOT_ENABLED.message => Ok(None),
        Err(status) => Err(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::http;

    fn no_prompt() -> Result<String, String> {
        panic!("the password was given; nothing to ask")
    }

    fn creds(name: &str, password: &str) -> Option<Credentials> {
        Some(Credentials {
            name: name.into(),
            password: password.into(),
        })
    }

    #[test]
    fn user_flag_splits_name_and_password_at_the_first_colon() {
        assert_eq!(
            credentials_from_flags("bench:pw", "", no_prompt),
            Ok(creds("bench", "pw"))
        );
        assert_eq!(
            credentials_from_flags("bench:p:w", "", no_prompt),
            Ok(creds("bench", "p:w"))
        );
    }

    #[test]
    fn password_flag_takes_the_user_flag_as_the_whole_name() {
        assert_eq!(
            credentials_from_flags("bench", "pw", no_prompt),
            Ok(creds("bench", "pw"))
        );
        assert_eq!(
            credentials_from_flags("a:b", "pw", no_prompt),
            Ok(creds("a:b", "pw"))
        );
    }

    #[test]
    fn user_name_alone_asks_for_the_password() {
        assert_eq!(
            credentials_from_flags("bench", "", || Ok("typed".into())),
            Ok(creds("bench", "typed"))
        );
        let refused = credentials_from_flags("bench", "", || Err("EOF".into()));
        assert_eq!(refused, Err("bad user information: bench EOF".into()));
    }

    #[test]
    fn no_user_means_no_authentication() {
        assert_eq!(credentials_from_flags("", "", no_prompt), Ok(None));
        assert!(credentials_from_flags("", "pw", no_prompt).is_err());
    }

    #[test]
    fn empty_password_skips_authentication_as_clientv3_does() {
        assert_eq!(credentials_from_flags("bench:", "", no_prompt), Ok(None));
        assert_eq!(
            credentials_from_flags("bench", "", || Ok(String::new())),
            Ok(None)
        );
    }

    #[test]
    fn credentials_debug_hides_the_password() {
        let shown = format!("{:?}", creds("bench", "secret"));
        assert!(
            shown.contains("bench") && !shown.contains("secret"),
            "{shown}"
        );
    }

    #[test]
    fn interceptor_adds_the_token_to_every_request() {
        let token = AsciiMetadataValue::from_static("abcdef.42");
        let mut interceptor = TokenInterceptor::new(Some(token));
        for _ in 0..2 {
            let request = interceptor
                .call(tonic::Request::new(()))
                .expect("the interceptor never refuses");
            assert_eq!(
                request
                    .metadata()
                    .get(TOKEN_METADATA_KEY)
                    .and_then(|v| v.to_str().ok()),
                Some("abcdef.42")
            );
            assert_eq!(
                request
                    .metadata()
                    .get_all(TOKEN_METADATA_KEY)
                    .iter()
                    .count(),
                1
            );
        }
    }

    /// A stand-in server that records the `token` header of each request it
    /// gets and answers every call with Unimplemented.
    #[derive(Clone, Default)]
    struct TokenRecorder {
        seen: std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>,
    }

    impl tonic::codegen::Service<http::Request<tonic::body::Body>> for TokenRecorder {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
            let token = request
                .headers()
                .get(TOKEN_METADATA_KEY)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            self.seen.lock().expect("not poisoned").push(token);
            let response = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "12")
                .body(tonic::body::Body::default())
                .expect("a valid response");
            std::future::ready(Ok(response))
        }
    }

    #[tokio::test]
    async fn token_reaches_the_wire_on_unary_and_streaming_calls() {
        use api::etcdserverpb::kv_client::KvClient;
        use api::etcdserverpb::watch_client::WatchClient;
        use api::etcdserverpb::{RangeRequest, WatchRequest};

        let server = TokenRecorder::default();
        let token = AsciiMetadataValue::from_static("abcdef.7");
        let connection =
            InterceptedService::new(server.clone(), TokenInterceptor::new(Some(token)));
        let unary = KvClient::new(connection.clone())
            .range(RangeRequest::default())
            .await;
        assert_eq!(
            unary.map(|_| ()).map_err(|s| s.code()),
            Err(tonic::Code::Unimplemented)
        );
        let streaming = WatchClient::new(connection)
            .watch(tokio_stream::iter(Vec::<WatchRequest>::new()))
            .await;
        assert_eq!(
            streaming.map(|_| ()).map_err(|s| s.code()),
            Err(tonic::Code::Unimplemented)
        );
        let seen = server.seen.lock().expect("not poisoned").clone();
        assert_eq!(seen, vec![Some("abcdef.7".to_string()); 2]);
    }

    #[test]
    fn interceptor_without_token_adds_nothing() {
        let request = TokenInterceptor::default()
            .call(tonic::Request::new(()))
            .expect("the interceptor never refuses");
        assert!(request.metadata().get(TOKEN_METADATA_KEY).is_none());
    }
}
