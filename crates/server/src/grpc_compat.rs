//! Where tonic's own answers differ from grpc-go's (and so from etcd's),
//! rewritten on the way out, so clients see etcd's code and message.

/// tonic refuses a request above the decoding limit with OutOfRange "Error,
/// decoded message length too large: found N bytes, the limit is: M bytes";
/// grpc-go (etcd) answers ResourceExhausted "grpc: received message larger
/// than max (N vs. M)". Such a refusal is a trailers-only response: the
/// status is in the headers.
pub fn rewrite_oversized_request<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    if headers.get("grpc-status").and_then(|v| v.to_str().ok()) != Some("11") {
        return response;
    }
    let Some(message) = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(percent_decode)
    else {
        return response;
    };
    let Some((found, limit)) = parse_too_large(&message) else {
        return response;
    };
    let rewritten = format!("grpc: received message larger than max ({found} vs. {limit})");
    if let Ok(value) = http::HeaderValue::from_str(&rewritten) {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
        headers.insert("grpc-message", value);
    }
    response
}

fn parse_too_large(message: &str) -> Option<(u64, u64)> {
    let rest = message.strip_prefix("Error, decoded message length too large: found ")?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    Some((found.parse().ok()?, limit.parse().ok()?))
}

/// gRPC's grpc-message percent-encoding (only `%XX` escapes).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_requests_get_grpc_go_wording() {
        let response = http::Response::builder()
            .header("grpc-status", "11")
            .header("grpc-message", "Error,%20decoded message length too large: found 3000000 bytes, the limit is: 2097152 bytes")
            .body(())
            .unwrap();
        let response = rewrite_oversized_request(response);
        assert_eq!(response.headers()["grpc-status"], "8");
        assert_eq!(
            response.headers()["grpc-message"],
            "grpc: received message larger than max (3000000 vs. 2097152)"
        );
    }

    #[test]
    fn other_statuses_pass_through() {
        let response = http::Response::builder()
            .header("grpc-status", "11")
            .header(
                "grpc-message",
                "etcdserver: mvcc: required revision is a future revision",
            )
            .body(())
            .unwrap();
        let response = rewrite_oversized_request(response);
        assert_eq!(response.headers()["grpc-status"], "11");
    }
}
