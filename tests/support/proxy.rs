//! A TCP proxy the test controls, for faults a server cannot produce on its own: a cut
//! connection, a black hole (connections stay open, nothing arrives), one lost publish, and
//! publishes held back and delivered late, as a paused server executes what was already in
//! its socket; and a far server, whose every answer arrives late.
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
    /// Connections accepted so far: each one's number is its place in that count.
    accepted: usize,
    /// Connections numbered below this stay black-holed for good.
    dark_below: usize,
    /// Drop the next client publish to a subject with this prefix.
    drop_publish: Option<String>,
    dropped: usize,
    /// The client speaks NATS: split what it sends into protocol frames.
    nats_frames: bool,
    /// Hold back everything the next connection to publish to `outbox.` sends from then on.
    hold_next_publisher: bool,
    /// Connections held back, in the order their hold began.
    held: Vec<Held>,
    /// Publishes to `outbox.` forwarded since the last hold began, by any connection.
    publishes_since_hold: usize,
    /// How long each chunk from the server waits before it is passed on: a far server.
    latency: std::time::Duration,
}

/// What one held connection sent and the server has not been given yet.
#[derive(Default)]
struct Held {
    bytes: Vec<u8>,
    publishes: usize,
    /// The socket to the server, kept open here once the client closed its side.
    upstream: Option<tokio::net::tcp::OwnedWriteHalf>,
    client_closed: bool,
    /// Told to a connection still open: deliver what was held and forward from then on.
    release: Arc<tokio::sync::Notify>,
    released: bool,
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

    /// Every answer from the server arrives `latency` late from now on, as from a server
    /// in another zone: requests asked one after another each wait it out.
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.state.lock().expect("proxy state").latency = latency;
    }

    /// Keeps connections open but lets nothing through, either way.
    pub fn blackhole(&self) {
        self.state.lock().expect("proxy state").mode = Some(Mode::Blackhole);
    }

    /// New connections pass again; those open now stay black-holed for good, as flows a
    /// stateful firewall or NAT forgot: no byte and no reset ever comes.
    pub fn heal_for_new_connections(&self) {
        let mut state = self.state.lock().expect("proxy state");
        state.dark_below = state.accepted;
        state.mode = Some(Mode::Pass);
    }

    /// How many connections were accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.lock().expect("proxy state").accepted
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

    /// Holds back what the next connection to publish to `outbox.` sends, from that publish
    /// on, until [`FaultProxy::release_held`]: its acks do not come, so the client may give
    /// up on it, while its bytes wait to be delivered late.
    pub fn hold_next_publisher(&self) {
        let mut state = self.state.lock().expect("proxy state");
        state.hold_next_publisher = true;
        state.publishes_since_hold = 0;
    }

    /// Of the `index`th held connection: (publishes held, whether its client closed it).
    pub fn held(&self, index: usize) -> (usize, bool) {
        let state = self.state.lock().expect("proxy state");
        state.held.get(index).map_or((0, false), |h| (h.publishes, h.client_closed))
    }

    /// Publishes to `outbox.` forwarded since the last hold began.
    pub fn publishes_since_hold(&self) -> usize {
        self.state.lock().expect("proxy state").publishes_since_hold
    }

    /// Delivers what the `index`th held connection sent to the server. A connection its
    /// client closed is then closed; an open one forwards as usual from then on.
    pub async fn release_held(&self, index: usize) {
        let (bytes, upstream, release) = {
            let mut state = self.state.lock().expect("proxy state");
            let held = state.held.get_mut(index).expect("a held connection");
            (std::mem::take(&mut held.bytes), held.upstream.take(), held.release.clone())
        };
        match upstream {
            Some(mut upstream) => {
                upstream.write_all(&bytes).await.expect("deliver the held publishes");
                let _ = upstream.flush().await;
                // Closed at once, the server could drop the connection before reading it.
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            None => {
                // The connection's own task writes them, in order with what follows.
                self.state.lock().expect("proxy state").held[index].bytes = bytes;
                release.notify_one();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !self.state.lock().expect("proxy state").held[index].released {
                    assert!(std::time::Instant::now() < deadline, "held bytes not delivered");
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        }
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

fn latency(state: &Mutex<State>) -> std::time::Duration {
    state.lock().map(|s| s.latency).unwrap_or_default()
}

fn mode(state: &Mutex<State>) -> Mode {
    state.lock().map(|s| s.mode.unwrap_or(Mode::Pass)).unwrap_or(Mode::Pass)
}

/// Whether connection number `id` lets nothing through.
fn dark(state: &Mutex<State>, id: usize) -> bool {
    mode(state) == Mode::Blackhole || state.lock().is_ok_and(|s| id < s.dark_below)
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
        let id = {
            let mut guard = state.lock().expect("proxy state");
            guard.accepted += 1;
            guard.accepted - 1
        };
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let nats = state.lock().expect("proxy state").nats_frames;
        let up = match nats {
            true => tokio::spawn(client_to_server(client_read, server_write, state.clone(), id)),
            false => tokio::spawn(pump(client_read, server_write, state.clone(), id, false)),
        };
        let down = tokio::spawn(pump(server_read, client_write, state.clone(), id, true));
        let mut guard = state.lock().expect("proxy state");
        guard.connections.push(up.abort_handle());
        guard.connections.push(down.abort_handle());
    }
}

/// Copied unless black-holed: server → client (`from_server`, late by the latency), and
/// client → server for other protocols.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<Mutex<State>>,
    id: usize,
    from_server: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if dark(&state, id) {
            if n == 0 {
                // A real black hole would not pass the close on either: stay open and
                // silent until restored (which ends this task).
                std::future::pending::<()>().await;
            }
            continue;
        }
        let latency = if from_server { latency(&state) } else { Default::default() };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
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
    id: usize,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // While held: this connection's index in `State::held`, and what releases it.
    let mut holding: Option<(usize, Arc<tokio::sync::Notify>)> = None;
    loop {
        let read = match &holding {
            Some((index, release)) => tokio::select! {
                read = from.read(&mut buf) => read,
                () = release.notified() => {
                    let bytes = {
                        let mut state = state.lock().expect("proxy state");
                        std::mem::take(&mut state.held[*index].bytes)
                    };
                    if to.write_all(&bytes).await.is_err() {
                        break;
                    }
                    state.lock().expect("proxy state").held[*index].released = true;
                    holding = None;
                    continue;
                }
            },
            None => from.read(&mut buf).await,
        };
        let Ok(n) = read else { break };
        if n == 0 {
            if let Some((index, _)) = holding {
                // Keep the server's side open, with what it has not been given yet.
                let mut state = state.lock().expect("proxy state");
                state.held[index].client_closed = true;
                state.held[index].upstream = Some(to);
                return;
            }
            break;
        }
        if dark(&state, id) {
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        let mut out = Vec::with_capacity(pending.len());
        let mut at = 0;
        while let Some(len) = frame_len(&pending[at..]) {
            let frame = &pending[at..at + len];
            let publish = is_outbox_publish(frame);
            let mut guard = state.lock().expect("proxy state");
            if publish && holding.is_none() {
                if std::mem::take(&mut guard.hold_next_publisher) {
                    let held = Held::default();
                    holding = Some((guard.held.len(), held.release.clone()));
                    guard.held.push(held);
                } else {
                    guard.publishes_since_hold += 1;
                }
            }
            match &holding {
                Some((index, _)) => {
                    let held = &mut guard.held[*index];
                    held.bytes.extend_from_slice(frame);
                    held.publishes += usize::from(publish);
                }
                None => {
                    drop(guard);
                    if !should_drop(frame, &state) {
                        out.extend_from_slice(frame);
                    }
                }
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

fn is_outbox_publish(frame: &[u8]) -> bool {
    frame.starts_with(b"HPUB outbox.") || frame.starts_with(b"PUB outbox.")
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
