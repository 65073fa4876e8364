//! TEMPORARY placeholder while the JWT provider is written (replaced in this session).
use api::rpctypes::{self, EtcdError};
use std::collections::BTreeMap;
pub struct JwtTokens;
impl JwtTokens {
    pub fn new(_opts: &BTreeMap<String, String>) -> Result<JwtTokens, String> {
        Err("jwt tokens are not available yet".into())
    }
    pub fn assign(&self, _username: &str, _revision: u64) -> Result<String, EtcdError> {
        Err(rpctypes::INVALID_AUTH_TOKEN)
    }
    pub fn info(&self, _token: &str) -> Option<(String, u64)> {
        None
    }
}
