//! The HTTP edges a client on a pod's or a balancer's side can reach: kept and pipelined connections, HEAD,
//! methods other than GET, heads that are slow, oversized or not HTTP, and half-closed clients.
use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    time::Instant,
};

use super::*;

/// A server answering each GET with its path, with `deadline` between requests.
fn echo(deadline: Duration) -> (JoinHandle<()>, SocketAddr) {
    let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let limits = Limits { deadline, ..Limits::default() };
    let server = serve_with(l, limits, |path| async move { Response::text(200, &format!("{path}\n")) });
    (server, addr)
}

/// One reply read off `s`: its head (status line and headers) and its body (`Content-Length` bytes, none
/// after a HEAD), or `None` if the connection ended first.
async fn reply(s: &mut TcpStream, head_only: bool) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 1];
        if s.read(&mut chunk).await.ok()? == 0 {
            return None;
        }
        buf.push(chunk[0]);
    };
    let head = String::from_utf8(buf[..end].to_vec()).unwrap();
    let len = header(&head, "content-length").map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0u8; if head_only { 0 } else { len }];
    s.read_exact(&mut body).await.ok()?;
    Some((head, String::from_utf8(body).unwrap()))
}

/// The value of header `name` (any case) in `head`.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
}

/// Within `within` the server closes `s`: a read returns EOF (or a reset), with nothing more sent.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Duration {
    let start = Instant::now();
    let mut rest = Vec::new();
    let r = tokio::time::timeout(within, s.read_to_end(&mut rest)).await;
    assert!(r.is_ok(), "still open after {within:?}");
    assert!(rest.is_empty(), "nothing after the reply: {:?}", String::from_utf8_lossy(&rest));
    start.elapsed()
}

#[tokio::test]
async fn a_plain_request_gets_its_reply_and_the_connection_closed() {
    let (_server, addr) = echo(Duration::from_secs(30));
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz?x=1 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let (head, body) = reply(&mut s, false).await.expect("a reply");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, "/healthz\n", "the path without its query");
    assert_eq!(header(&head, "connection"), Some("close"), "{head}");
    assert_eq!(header(&head, "content-type"), Some("text/plain; charset=utf-8"), "{head}");
    // Closed at once, not after the 30 s deadline.
    closed_within(&mut s, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_client_asking_keep_alive_is_served_again_on_its_connection_until_it_idles_past_the_deadline() {
    let (_server, addr) = echo(Duration::from_millis(500));
    let mut s = TcpStream::connect(addr).await.unwrap();
    for path in ["/livez", "/healthz", "/metrics"] {
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let (head, body) = reply(&mut s, false).await.unwrap_or_else(|| panic!("{path}: closed"));
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert_eq!(body, format!("{path}\n"));
        assert_ne!(header(&head, "connection"), Some("close"), "{head}");
    }
    // Idle: closed at the deadline, counted from the last request.
    let idle = closed_within(&mut s, Duration::from_secs(3)).await;
    assert!(
        idle >= Duration::from_millis(400) && idle < Duration::from_millis(1500),
        "closed after {idle:?}"
    );
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (_server, addr) = echo(Duration::from_secs(30));
    let mut s = TcpStream::connect(addr).await.unwrap();
    // Three requests in one write; the last one asks to close.
    let k = "Host: x\r\nConnection: keep-alive\r\n\r\n";
    s.write_all(
        format!("GET /a HTTP/1.1\r\n{k}GET /b HTTP/1.1\r\n{k}GET /c HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    for path in ["/a\n", "/b\n", "/c\n"] {
        let (head, body) = reply(&mut s, false).await.unwrap_or_else(|| panic!("{path:?}: closed"));
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert_eq!(body, path);
    }
    closed_within(&mut s, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn head_gets_the_headers_of_get_without_the_body() {
    let (_server, addr) = echo(Duration::from_secs(30));
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"HEAD /livez HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let (head, _) = reply(&mut s, true).await.expect("a reply");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(header(&head, "content-length"), Some("7"), "the length GET /livez would send: {head}");
    closed_within(&mut s, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_method_other_than_get_or_head_is_refused_with_405() {
    let (_server, addr) = echo(Duration::from_secs(30));
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello").await.unwrap();
    let (head, body) = reply(&mut s, false).await.expect("a reply");
    assert!(head.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{head}");
    assert_eq!(header(&head, "allow"), Some("GET, HEAD"), "{head}");
    assert_eq!(body, "method not allowed\n");
}

#[tokio::test]
async fn an_oversized_head_is_answered_431_and_the_server_goes_on() {
    let (_server, addr) = echo(Duration::from_secs(30));
    let mut s = TcpStream::connect(addr).await.unwrap();
    let big = "a".repeat(MAX_HEAD + 1);
    s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (head, _) = reply(&mut s, false).await.expect("a reply");
    assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{head}");
    closed_within(&mut s, Duration::from_secs(2)).await;
    // A head just within the bound is served.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let fits = "a".repeat(MAX_HEAD - 100);
    s.write_all(format!("GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: {fits}\r\n\r\n").as_bytes()).await.unwrap();
    let (head, body) = reply(&mut s, false).await.expect("a reply");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, "/ok\n");
}

#[tokio::test]
async fn what_is_not_an_http_request_is_answered_400_or_not_at_all() {
    let (_server, addr) = echo(Duration::from_secs(30));
    // A request line that is not one.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GARBAGE\r\n\r\n").await.unwrap();
    let (head, _) = reply(&mut s, false).await.expect("a reply");
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
    closed_within(&mut s, Duration::from_secs(2)).await;
    // A client that connects and closes its side at once asked nothing: no reply.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.shutdown().await.unwrap();
    closed_within(&mut s, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_client_that_half_closes_after_its_request_still_gets_the_reply() {
    // A handler that takes a while (a /metrics encoding): the client's FIN arrives before the reply.
    let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let _server = serve(l, |path| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        Response::text(200, &format!("{path}\n"))
    });
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    s.shutdown().await.unwrap();
    let (head, body) = reply(&mut s, false).await.expect("a reply");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, "/readyz\n");
}

#[tokio::test]
async fn a_kept_connection_trickling_its_next_head_is_cut_off_at_the_deadline() {
    let (_server, addr) = echo(Duration::from_millis(500));
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /first HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n").await.unwrap();
    assert!(reply(&mut s, false).await.is_some());
    let (mut rd, mut wr) = s.into_split();
    // The next head one header line per 200 ms, forever: each line is quick, the head never ends.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(b"GET /second HTTP/1.1\r\n").await;
        for i in 0.. {
            if wr.write_all(format!("X-{i}: y\r\n").as_bytes()).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let start = Instant::now();
    let mut got = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(3), rd.read_to_end(&mut got)).await;
    let took = start.elapsed();
    writer.abort();
    assert!(r.is_ok(), "still open after 3 s");
    assert!(got.is_empty(), "an unfinished head gets no reply: {:?}", String::from_utf8_lossy(&got));
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(1500),
        "closed after {took:?}"
    );
}

#[test]
fn keep_alive_is_a_token_of_the_connection_header() {
    let cases: &[(&[&str], bool)] = &[
        (&[], false),
        (&["keep-alive"], true),
        (&["Keep-Alive"], true),
        (&["Upgrade, keep-alive"], true),
        (&["close"], false),
        (&["keep-alives"], false),
        (&["close", "keep-alive"], false),
    ];
    for (values, want) in cases {
        let mut h = hyper::HeaderMap::new();
        for v in *values {
            h.append(hyper::header::CONNECTION, HeaderValue::from_str(v).unwrap());
        }
        assert_eq!(asks_keep_alive(&h), *want, "{values:?}");
    }
}

#[tokio::test]
async fn a_client_that_does_not_read_its_reply_is_cut_off_at_the_deadline() {
    // A reply larger than both sockets' buffers (a /metrics of many Services): the server's write waits on
    // the client.
    const BODY: usize = 32 << 20;
    let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let limits = Limits { deadline: Duration::from_millis(500), ..Limits::default() };
    let _server = serve_with(l, limits, |_| async { Response::text(200, &"m".repeat(BODY)) });
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Reading now finds what the buffers held, then the end: the server gave up on the rest.
    let mut got = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    assert!(r.is_ok(), "the server still writes after 6.5 s");
    assert!(got.len() < BODY, "the whole reply came ({} bytes) to a client that did not read", got.len());
}
