//! The HTTP/2 flow-control settings of every gRPC server and client the services build, and
//! the words for an HTTP/2 failure under a gRPC status.
//!
//! # The rule
//!
//! h2 (0.4.16 and later) charges every received DATA frame whose payload is under
//! [`H2_SMALL_FRAME_BYTES`] (256) bytes `256 - payload` bytes of a per-connection *data frame
//! budget* while the frame sits unread in h2's buffer, and gives the charge back when the
//! application reads it. A connection whose unread small frames exceed the budget is closed
//! with `GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`. Since h2 0.4.19 the budget is half
//! the receiver's connection window (at least 25,600 bytes) unless `data_frame_budget` sets it.
//!
//! Unread frames pile up when the receiving process stalls (stopped, swapped, starved on a
//! loaded host) while its peer keeps writing: the peer may send a whole stream window before
//! flow control stops it, and once the receiver runs again its connection task reads every
//! frame the socket holds before the stream's reader drains them. A window of `W` bytes of
//! `p`-byte frames is charged `W / p * (256 - p)`; with hyper's defaults (1 MiB stream and
//! connection windows on a server, so a 512 KiB budget) 2,500 messages of ~40 bytes, 1.3 s of
//! a 2,000 a second flow, close the connection.
//!
//! Neither hyper 1.12 nor tonic 0.14.5 exposes h2's `data_frame_budget` (hyper's HTTP/2
//! builders and tonic's `Server` / `Endpoint` set windows, frame size, keepalive, but not the
//! budget), so it stays h2's automatic one, half the connection window, and the lever is the
//! windows: a connection window far larger than the stream window. With
//! [`STREAM_WINDOW_BYTES`] = 128 KiB and [`CONNECTION_WINDOW_BYTES`] = 16 MiB the budget is
//! 8 MiB, and one stream's whole window of the smallest gRPC frames (an empty message: its
//! 5-byte prefix) is charged at most 128 KiB / 5 * 251 = 6.6 MB: **no single stream, whatever
//! its messages, can close its connection by being read late**. Several streams on one
//! connection share the budget: `k` streams of frames of at least `p` bytes are safe while
//! `k * 128 KiB / p * (256 - p) <= 8 MiB` (5 streams of 20-byte frames, 13 of 45-byte ones).
//! Every stream the services run has its own connection except the queries a client
//! multiplexes.
//!
//! What the windows cost: a stream moves at most 128 KiB per round trip (1.3 MB/s at 100 ms,
//! 10 MB/s at 13 ms), which bounds a barrier snapshot over a long WAN link; memory per
//! connection is bounded by the connection window (16 MiB of data, plus at most the 8 MiB
//! budget of frame bookkeeping) and per stream by the stream window. Adaptive windows (BDP
//! probing) stay off: they resize both windows to one value, the budget with them, and break
//! the ratio.
//!
//! Where we are the sender, tonic already puts every message ready at once into one DATA
//! frame (up to 32 KiB), so a backlog leaves in large frames; only a flow sent one message at
//! a time while the window is open produces small ones, and the windows above bound those.

use std::error::Error as StdError;

use tonic::Status;
use tonic::transport::{Endpoint, Server};

/// HTTP/2 `SETTINGS_INITIAL_WINDOW_SIZE` of every server and client: what a peer may send on
/// one stream before the reader takes it.
pub const STREAM_WINDOW_BYTES: u32 = 128 << 10;
/// The connection window of every server and client: what a peer may send on all of one
/// connection's streams; twice h2's data frame budget.
pub const CONNECTION_WINDOW_BYTES: u32 = 16 << 20;
/// h2's data frame budget with these windows (its automatic budget: half the connection
/// window).
pub const DATA_FRAME_BUDGET_BYTES: usize = CONNECTION_WINDOW_BYTES as usize / 2;
/// h2 charges a received DATA frame with a payload under this many bytes.
pub const H2_SMALL_FRAME_BYTES: usize = 256;
/// The smallest DATA frame of a gRPC stream: an empty message's length prefix.
pub const MIN_GRPC_FRAME_BYTES: usize = 5;

/// The most h2 charges one stream's full window of `frame_bytes`-byte DATA frames against
/// the data frame budget (0 for frames of [`H2_SMALL_FRAME_BYTES`] or more).
pub const fn stream_window_charge(frame_bytes: usize) -> usize {
    if frame_bytes >= H2_SMALL_FRAME_BYTES || frame_bytes == 0 {
        return 0;
    }
    STREAM_WINDOW_BYTES as usize / frame_bytes * (H2_SMALL_FRAME_BYTES - frame_bytes)
}

/// The connection window per byte of stream window: a stream's whole window of the smallest
/// gRPC frames is charged `stream / 5 * 251` (about 50 times the stream window), under the
/// budget of half a connection window of 128 stream windows.
pub const CONNECTION_WINDOWS_PER_STREAM: u32 = CONNECTION_WINDOW_BYTES / STREAM_WINDOW_BYTES;

/// `builder` with the flow-control windows of the rule above (adaptive windows off).
pub fn server(builder: Server) -> Server {
    server_with(builder, STREAM_WINDOW_BYTES)
}

/// [`server`] with a stream window of `stream_window` bytes (`transport.stream_window_kib`)
/// and a connection window [`CONNECTION_WINDOWS_PER_STREAM`] times it, so the rule holds at
/// any size: a larger window buys a stream more throughput per round trip (a barrier snapshot
/// over a long WAN link) for more memory a connection may hold unread.
pub fn server_with(builder: Server, stream_window: u32) -> Server {
    builder
        .initial_stream_window_size(stream_window)
        .initial_connection_window_size(stream_window.saturating_mul(CONNECTION_WINDOWS_PER_STREAM))
        .http2_adaptive_window(Some(false))
}

/// `endpoint` with the same windows as [`server`] (adaptive windows off).
pub fn endpoint(endpoint: Endpoint) -> Endpoint {
    endpoint
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .http2_adaptive_window(false)
}

/// The HTTP/2 error under a gRPC status or transport error, if any (tonic keeps hyper's error,
/// and h2's under it, as the source chain).
pub fn h2_error<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a h2::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            return Some(h2);
        }
        next = error.source();
    }
    None
}

/// What closed a stream, in words, when a gRPC status came from the transport under it: a
/// `GOAWAY` (who sent it, its reason, and a received one's debug data, e.g. `HTTP/2 GOAWAY
/// ENHANCE_YOUR_CALM sent by the peer: ... (b"too_many_data_frames")`; h2 keeps no debug data
/// for one it sent, so that one names the limits that send it), a `RST_STREAM`, or the source
/// chain. `None` when the status has no source (the peer's own status).
pub fn transport_cause(status: &Status) -> Option<String> {
    let source = StdError::source(status)?;
    if let Some(h2) = h2_error(source) {
        let reason = h2
            .reason()
            .map_or_else(|| "?".to_owned(), |r| format!("{r:?}"));
        let by = if h2.is_remote() {
            "sent by the peer"
        } else {
            "sent by this side"
        };
        if h2.is_go_away() {
            // h2's words carry a received GOAWAY's debug data ("... (b\"too_many_data_frames\")");
            // the error h2 reports for one it sent itself does not, so that one says which of
            // h2's limits send it.
            let ours = if !h2.is_remote() && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM) {
                "; h2 sends it when a peer exceeds one of its limits: unread small DATA frames \
                 over the data frame budget (\"too_many_data_frames\"), reset or empty frames"
            } else {
                ""
            };
            return Some(format!("HTTP/2 GOAWAY {reason} {by}: {h2}{ours}"));
        }
        if h2.is_reset() {
            return Some(format!("HTTP/2 RST_STREAM {reason} {by}: {h2}"));
        }
        return Some(format!("HTTP/2 error {reason}: {h2}"));
    }
    let mut text = source.to_string();
    let mut next = source.source();
    while let Some(error) = next {
        text.push_str(": ");
        text.push_str(&error.to_string());
        next = error.source();
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stream_of_any_grpc_frames_fits_the_data_frame_budget() {
        for frame in MIN_GRPC_FRAME_BYTES..H2_SMALL_FRAME_BYTES + 10 {
            assert!(
                stream_window_charge(frame) <= DATA_FRAME_BUDGET_BYTES,
                "{frame}-byte frames: {} > {DATA_FRAME_BUDGET_BYTES}",
                stream_window_charge(frame)
            );
        }
        // The documented multi-stream examples.
        assert!(5 * stream_window_charge(20) <= DATA_FRAME_BUDGET_BYTES);
        assert!(13 * stream_window_charge(45) <= DATA_FRAME_BUDGET_BYTES);
        // Any configured stream window keeps the rule, within HTTP/2's largest window.
        for kib in [64u64, 128, 1024, 8192] {
            let stream = kib << 10;
            let connection = stream * u64::from(CONNECTION_WINDOWS_PER_STREAM);
            let charge = stream / MIN_GRPC_FRAME_BYTES as u64
                * (H2_SMALL_FRAME_BYTES - MIN_GRPC_FRAME_BYTES) as u64;
            assert!(charge <= connection / 2, "{kib} KiB");
            assert!(connection < 1 << 31, "{kib} KiB");
        }
        // hyper's server defaults (1 MiB windows, a 512 KiB budget) fail the rule.
        let default_charge = (1usize << 20) / 40 * (256 - 40);
        assert!(default_charge > (1 << 20) / 2);
    }

    #[test]
    fn a_status_without_a_source_has_no_transport_cause() {
        assert_eq!(transport_cause(&Status::cancelled("peer said so")), None);
    }

    /// A real h2 server with a tiny data frame budget that never reads a stream's body: it
    /// closes the connection with `GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`, and both
    /// sides' errors, as gRPC statuses, name it (with who sent it).
    #[tokio::test]
    async fn a_real_too_many_data_frames_goaway_is_named_on_both_sides() {
        use prost::bytes::Bytes;
        use tonic::codegen::http;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::Builder::new()
                .data_frame_budget(1_000)
                .handshake::<_, Bytes>(socket)
                .await
                .unwrap();
            let mut held = Vec::new();
            while let Some(accepted) = conn.accept().await {
                match accepted {
                    Ok(stream) => held.push(stream),
                    Err(error) => return error,
                }
            }
            panic!("the connection ended without an error");
        });
        let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::handshake(socket).await.unwrap();
        let driver = tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let request = http::Request::post("http://ckf/flow").body(()).unwrap();
        let (_response, mut body) = client.send_request(request, false).unwrap();
        for _ in 0..200 {
            if body.send_data(Bytes::from_static(b"x"), false).is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }

        let server_error = server.await.unwrap();
        let ours = transport_cause(&Status::from_error(Box::new(server_error))).unwrap();
        assert!(
            ours.contains("GOAWAY ENHANCE_YOUR_CALM sent by this side")
                && ours.contains("data frame budget"),
            "{ours}"
        );
        let client_error = driver.await.unwrap().unwrap_err();
        let theirs = transport_cause(&Status::from_error(Box::new(client_error))).unwrap();
        assert!(
            theirs.contains("GOAWAY ENHANCE_YOUR_CALM sent by the peer")
                && theirs.contains("too_many_data_frames"),
            "{theirs}"
        );
    }
}
