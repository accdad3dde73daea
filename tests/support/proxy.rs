//! A TCP proxy the test controls, for faults a server cannot produce on its own: a cut
//! connection, a black hole (connections stay open, nothing arrives), and one lost publish.
//! [`FaultProxy::start`] reads the NATS protocol (to drop a publish); for any other protocol,
//! Postgres's for one, [`FaultProxy::start_bytes`] copies bytes without reading them.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Pass,
    Refuse,
    Blackhole,
}

#[derive(Default)]
struct State {
    mode: Option<Mode>,
    connections: Vec<AbortHandle>,
    /// Drop the next client publish to a subject with this prefix.
    drop_publish: Option<String>,
    dropped: usize,
    /// The client speaks NATS: split what it sends into protocol frames.
    nats_frames: bool,
}

pub struct FaultProxy {
    port: u16,
    state: Arc<Mutex<State>>,
    accept: AbortHandle,
}

impl FaultProxy {
    /// Proxies a free local port to the NATS server at `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> FaultProxy {
        FaultProxy::start_with(upstream, true).await
    }

    /// Proxies a free local port to `127.0.0.1:upstream`, whatever the protocol;
    /// [`FaultProxy::drop_next_publish`] does nothing.
    pub async fn start_bytes(upstream: u16) -> FaultProxy {
        FaultProxy::start_with(upstream, false).await
    }

    async fn start_with(upstream: u16, nats_frames: bool) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let state = State { mode: Some(Mode::Pass), nats_frames, ..State::default() };
        let state = Arc::new(Mutex::new(state));
        let accept = tokio::spawn(accept_loop(listener, upstream, state.clone())).abort_handle();
        FaultProxy { port, state, accept }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Closes every connection and refuses new ones until [`FaultProxy::restore`].
    pub fn cut(&self) {
        let mut state = self.state.lock().expect("proxy state");
        state.mode = Some(Mode::Refuse);
        state.connections.drain(..).for_each(|c| c.abort());
    }

    /// Keeps connections open but lets nothing through, either way.
    pub fn blackhole(&self) {
        self.state.lock().expect("proxy state").mode = Some(Mode::Blackhole);
    }

    /// Back to normal. Black-holed connections lost bytes mid-stream, so they are closed.
    pub fn restore(&self) {
        let mut state = self.state.lock().expect("proxy state");
        if state.mode == Some(Mode::Blackhole) {
            state.connections.drain(..).for_each(|c| c.abort());
        }
        state.mode = Some(Mode::Pass);
    }

    /// Silently drops the next publish whose subject starts with `prefix`.
    pub fn drop_next_publish(&self, prefix: &str) {
        self.state.lock().expect("proxy state").drop_publish = Some(prefix.to_owned());
    }

    /// How many publishes were dropped so far.
    pub fn dropped(&self) -> usize {
        self.state.lock().expect("proxy state").dropped
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(mut state) = self.state.lock() {
            state.connections.drain(..).for_each(|c| c.abort());
        }
    }
}

fn mode(state: &Mutex<State>) -> Mode {
    state.lock().map(|s| s.mode.unwrap_or(Mode::Pass)).unwrap_or(Mode::Pass)
}

async fn accept_loop(listener: TcpListener, upstream: u16, state: Arc<Mutex<State>>) {
    while let Ok((client, _)) = listener.accept().await {
        if mode(&state) == Mode::Refuse {
            drop(client);
            continue;
        }
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
            continue;
        };
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let nats = state.lock().expect("proxy state").nats_frames;
        let up = match nats {
            true => tokio::spawn(client_to_server(client_read, server_write, state.clone())),
            false => tokio::spawn(pump(client_read, server_write, state.clone())),
        };
        let down = tokio::spawn(pump(server_read, client_write, state.clone()));
        let mut guard = state.lock().expect("proxy state");
        guard.connections.push(up.abort_handle());
        guard.connections.push(down.abort_handle());
    }
}

/// Copied unless black-holed: server → client, and client → server for other protocols.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<Mutex<State>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if mode(&state) == Mode::Blackhole {
            if n == 0 {
                // A real black hole would not pass the close on either: stay open and
                // silent until restored (which ends this task).
                std::future::pending::<()>().await;
            }
            continue;
        }
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

/// Client → server, frame by frame, so that one publish can be dropped whole.
async fn client_to_server(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<Mutex<State>>,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if mode(&state) == Mode::Blackhole {
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        let mut out = Vec::with_capacity(pending.len());
        let mut at = 0;
        while let Some(len) = frame_len(&pending[at..]) {
            let frame = &pending[at..at + len];
            if !should_drop(frame, &state) {
                out.extend_from_slice(frame);
            }
            at += len;
        }
        pending.drain(..at);
        if to.write_all(&out).await.is_err() {
            break;
        }
    }
}

/// The length of the first complete protocol frame in `buf`, if it is all there.
fn frame_len(buf: &[u8]) -> Option<usize> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n")? + 2;
    let line = std::str::from_utf8(&buf[..line_end]).ok()?;
    let payload = if line.starts_with("HPUB ") || line.starts_with("PUB ") {
        line.split_whitespace().last()?.parse::<usize>().ok()? + 2
    } else {
        0
    };
    let total = line_end + payload;
    (buf.len() >= total).then_some(total)
}

fn should_drop(frame: &[u8], state: &Mutex<State>) -> bool {
    let mut state = state.lock().expect("proxy state");
    let Some(prefix) = state.drop_publish.clone() else {
        return false;
    };
    let line = String::from_utf8_lossy(&frame[..frame.len().min(256)]);
    let subject = line.split_whitespace().nth(1).unwrap_or_default();
    let publish = line.starts_with("HPUB ") || line.starts_with("PUB ");
    if publish && subject.starts_with(&prefix) {
        state.drop_publish = None;
        state.dropped += 1;
        return true;
    }
    false
}
