//! A TCP proxy on a loopback port, for a test to put between a process and a
//! server: it forwards every connection to the server as it comes, and
//! [`Proxy::cut`] closes every connection open through it at once (both sides),
//! as a network device dropping its flows would, while new connections keep
//! working. It runs on a thread and runtime of its own, so the test's runtime being
//! busy never slows what goes through it. [`Proxy::delayed`] adds a fixed latency
//! each way (a server across a slow network, or one slow to answer), without
//! bounding how much goes through.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A running proxy; stopped (with every connection through it) when dropped.
pub struct Proxy {
    /// The loopback port it listens on.
    pub port: u16,
    /// Cancelled by [`Proxy::cut`] (then replaced): the connections open now.
    current: Arc<Mutex<CancellationToken>>,
    shutdown: CancellationToken,
    accepted: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
}

impl Proxy {
    /// Listen on a free loopback port and forward each connection to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        Proxy::delayed(target, Duration::ZERO)
    }

    /// [`Proxy::start`], each byte forwarded `delay` after it came, both ways (a
    /// round trip through it takes twice `delay` longer).
    pub fn delayed(target: SocketAddr, delay: Duration) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let current = Arc::new(Mutex::new(CancellationToken::new()));
        let shutdown = CancellationToken::new();
        let accepted = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicU64::new(0));
        let (cur, stop, acc, cuts) = (
            current.clone(),
            shutdown.clone(),
            accepted.clone(),
            cut.clone(),
        );
        std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).unwrap();
                    loop {
                        let (client, _) = tokio::select! {
                            _ = stop.cancelled() => return,
                            r = listener.accept() => match r {
                                Ok(c) => c,
                                Err(_) => continue,
                            },
                        };
                        acc.fetch_add(1, Ordering::Relaxed);
                        let token = cur.lock().unwrap().clone();
                        let (stop, cuts) = (stop.clone(), cuts.clone());
                        tokio::spawn(async move {
                            let Ok(server) = TcpStream::connect(target).await else {
                                return;
                            };
                            forward(client, server, delay, (token, stop), cuts).await;
                        });
                    }
                });
            })
            .expect("proxy thread");
        Proxy {
            port,
            current,
            shutdown,
            accepted,
            cut,
        }
    }

    /// Its address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Close every connection open through it now; later ones are forwarded as
    /// before.
    pub fn cut(&self) {
        let mut current = self.current.lock().unwrap();
        current.cancel();
        *current = CancellationToken::new();
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connections closed by [`Proxy::cut`] so far.
    pub fn cut_connections(&self) -> u64 {
        self.cut.load(Ordering::Relaxed)
    }
}

/// Copy both ways until either side closes, the connection is cut or the proxy
/// stops; dropping both streams then closes them.
async fn forward(
    mut client: TcpStream,
    mut server: TcpStream,
    delay: Duration,
    (token, stop): (CancellationToken, CancellationToken),
    cuts: Arc<AtomicU64>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let copy = async {
        if delay.is_zero() {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        } else {
            let (client_rx, client_tx) = client.split();
            let (server_rx, server_tx) = server.split();
            tokio::join!(
                late(client_rx, server_tx, delay),
                late(server_rx, client_tx, delay)
            );
        }
    };
    tokio::select! {
        _ = copy => {}
        _ = token.cancelled() => {
            cuts.fetch_add(1, Ordering::Relaxed);
        }
        _ = stop.cancelled() => {}
    }
}

/// Copy `from` to `to`, each read written `delay` after it came (reads go on
/// meanwhile, so the delay adds latency, not a bound on throughput).
async fn late(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    delay: Duration,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let due = tokio::time::Instant::now() + delay;
            if tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.current.lock().unwrap().cancel();
    }
}
