use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const MIN_TIME: Duration = Duration::from_millis(200);

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    FrameHeader {
        length: payload.len(),
        kind,
        flags,
        stream,
    }
    .write(&mut out);
    out.extend_from_slice(payload);
    out
}

fn ping(n: u8) -> Vec<u8> {
    frame(PING, 0, 0, &[n; 8])
}

/// The client's opening: the preface, SETTINGS, and a HEADERS opening
/// stream 1 (its header block is not looked at).
fn opening() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(HEADERS, 0x4, 1, b"header block"));
    out
}

#[test]
fn the_first_ping_is_never_a_strike_and_the_third_strike_calls_for_calm() {
    let start = Instant::now();
    let mut strikes = PingStrikes::new(MIN_TIME);
    assert!(!strikes.ping(start, 1));
    assert!(!strikes.ping(start, 1));
    assert!(!strikes.ping(start, 1));
    assert!(strikes.ping(start, 1));
}

#[test]
fn pings_min_time_apart_with_a_stream_are_fine() {
    let mut now = Instant::now();
    let mut strikes = PingStrikes::new(MIN_TIME);
    for _ in 0..10 {
        assert!(!strikes.ping(now, 1));
        now += MIN_TIME;
    }
}

#[test]
fn pings_without_a_stream_must_be_two_hours_apart() {
    let mut now = Instant::now();
    let mut strikes = PingStrikes::new(MIN_TIME);
    let calm: Vec<bool> = (0..4)
        .map(|_| {
            now += Duration::from_secs(3600);
            strikes.ping(now, 0)
        })
        .collect();
    assert_eq!(calm, [false, false, false, true]);
    let mut strikes = PingStrikes::new(MIN_TIME);
    for _ in 0..5 {
        now += NO_STREAM_PING_INTERVAL;
        assert!(!strikes.ping(now, 0));
    }
}

#[test]
fn server_headers_or_data_forgive_the_strikes_and_the_next_ping() {
    let now = Instant::now();
    let mut strikes = PingStrikes::new(MIN_TIME);
    for _ in 0..3 {
        assert!(!strikes.ping(now, 1));
    }
    strikes.server_sent_headers_or_data();
    // not judged, strikes back to 0: two more strikes are allowed
    assert!(!strikes.ping(now, 1));
    assert!(!strikes.ping(now, 1));
    assert!(!strikes.ping(now, 1));
    assert!(strikes.ping(now, 1));
}

#[test]
fn frame_headers_are_found_in_pieces_of_any_size() {
    let mut bytes = frame(DATA, 0, 1, &[7; 300]);
    bytes.extend(frame(HEADERS, END_STREAM | 0x4, 3, b"abc"));
    bytes.extend(ping(1));
    for piece in [1, 2, 5, 9, 10, 64, bytes.len()] {
        let mut cursor = FrameCursor::default();
        let mut seen = Vec::new();
        for chunk in bytes.chunks(piece) {
            let passed = cursor.feed(chunk, |header| {
                seen.push((header.kind, header.flags, header.stream, header.length));
                ControlFlow::Continue(())
            });
            assert_eq!(passed, chunk.len());
        }
        assert_eq!(
            seen,
            [(DATA, 0, 1, 300), (HEADERS, 5, 3, 3), (PING, 0, 0, 8)],
            "pieces of {piece}"
        );
        assert_eq!(cursor.to_boundary(&[]), Some(0));
    }
}

#[test]
fn the_end_of_the_frame_under_way_is_found() {
    let data = frame(DATA, 0, 1, &[7; 20]);
    let mut cursor = FrameCursor::default();
    assert_eq!(cursor.to_boundary(&data), Some(0));
    cursor.feed(&data[..4], |_| ControlFlow::Continue(()));
    assert_eq!(cursor.to_boundary(&data[4..]), Some(data.len() - 4));
    assert_eq!(cursor.to_boundary(&data[4..8]), None);
    cursor.feed(&data[4..12], |_| ControlFlow::Continue(()));
    assert_eq!(cursor.to_boundary(&data[12..]), Some(data.len() - 12));
    assert_eq!(cursor.to_boundary(&[]), None);
}

/// Reads what the wrapped side hands on until it ends.
async fn read_to_end(mut io: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn a_ping_too_many_is_acked_then_goaway_enhance_your_calm_and_the_connection_ends() {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let mut server = PingPoliced::new(server, Some(Duration::from_secs(3600)));
    let mut sent = opening();
    for n in 1..=4 {
        sent.extend(ping(n));
    }
    // what comes after the offending ping is never handed on
    sent.extend(frame(HEADERS, 0x4, 3, b"later"));
    client.write_all(&sent).await.unwrap();

    let handed_on = read_to_end(&mut server).await;
    let mut expected = opening();
    for n in 1..=3 {
        expected.extend(ping(n));
    }
    assert_eq!(handed_on, expected);
    assert!(server.write_all(b"x").await.is_err());

    let answer = read_to_end(&mut client).await;
    let mut expected = frame(PING, ACK, 0, &[4; 8]);
    let mut goaway = 1u32.to_be_bytes().to_vec();
    goaway.extend(ENHANCE_YOUR_CALM.to_be_bytes());
    goaway.extend(b"too_many_pings");
    expected.extend(frame(GOAWAY, 0, 0, &goaway));
    assert_eq!(answer, expected);
}

#[tokio::test]
async fn the_goaway_waits_for_the_end_of_the_frame_hyper_has_begun() {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let mut server = PingPoliced::new(server, Some(Duration::from_secs(3600)));
    client.write_all(&opening()).await.unwrap();
    let mut buf = vec![0u8; opening().len()];
    server.read_exact(&mut buf).await.unwrap();
    let data = frame(DATA, 0, 1, &[9; 100]);
    server.write_all(&data[..30]).await.unwrap();
    // DATA forgives the next ping; the fourth is one too many
    for n in 1..=5 {
        client.write_all(&ping(n)).await.unwrap();
    }
    let mut handed_on = vec![0u8; 3 * 17];
    server.read_exact(&mut handed_on).await.unwrap();
    // the next read waits for hyper to finish its frame
    let read = tokio::time::timeout(Duration::from_millis(50), server.read(&mut buf)).await;
    assert!(read.is_err(), "the read waits: {read:?}");
    // hyper goes on writing: the frame is let through to its end, no more
    let mut rest = data[30..].to_vec();
    rest.extend(frame(DATA, 0, 1, b"never"));
    let n = server.write(&rest).await.unwrap();
    assert_eq!(n, data.len() - 30);
    assert!(server.write(&rest[n..]).await.is_err());
    drop(server);

    let answer = read_to_end(&mut client).await;
    assert_eq!(&answer[..data.len()], &data[..]);
    let goaway = &answer[data.len() + 17..];
    assert_eq!(goaway[3], GOAWAY);
    assert!(goaway.ends_with(b"too_many_pings"));
}

#[tokio::test]
async fn http1_passes_untouched() {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let mut server = PingPoliced::new(server, Some(Duration::from_secs(3600)));
    let mut sent = b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    for n in 1..=8 {
        sent.extend(ping(n));
    }
    client.write_all(&sent).await.unwrap();
    drop(client);
    assert_eq!(read_to_end(&mut server).await, sent);
    assert!(server.policing.is_none());
}

#[tokio::test]
async fn without_a_policy_pings_pass() {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let mut server = PingPoliced::new(server, None);
    let mut sent = opening();
    for n in 1..=8 {
        sent.extend(ping(n));
    }
    client.write_all(&sent).await.unwrap();
    drop(client);
    assert_eq!(read_to_end(&mut server).await, sent);
}

#[tokio::test]
async fn a_stream_the_server_ended_is_no_longer_open() {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let mut server = PingPoliced::new(server, Some(Duration::from_secs(3600)));
    client.write_all(&opening()).await.unwrap();
    let mut buf = vec![0u8; opening().len()];
    server.read_exact(&mut buf).await.unwrap();
    let policing = server.policing.as_ref().unwrap();
    assert_eq!(policing.open_streams.len(), 1);
    server
        .write_all(&frame(HEADERS, END_STREAM | 0x4, 1, b"trailers"))
        .await
        .unwrap();
    let policing = server.policing.as_ref().unwrap();
    assert!(policing.open_streams.is_empty());
    assert_eq!(policing.last_client_stream, 1);
    // the client resets the stream it opens next
    client
        .write_all(&frame(HEADERS, 0x4, 3, b"h"))
        .await
        .unwrap();
    client
        .write_all(&frame(RST_STREAM, 0, 3, &[0, 0, 0, 8]))
        .await
        .unwrap();
    let mut buf = vec![0u8; 2 * 9 + 5];
    server.read_exact(&mut buf).await.unwrap();
    let policing = server.policing.as_ref().unwrap();
    assert!(policing.open_streams.is_empty());
    assert_eq!(policing.last_client_stream, 3);
}
