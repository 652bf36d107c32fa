//! A TCP proxy on a loopback port, for a test to put between a process and a
//! server: it forwards every connection to the server as it comes, and
//! [`Proxy::cut`] closes every connection open through it at once (both sides),
//! as a network device dropping its flows would, while new connections keep
//! working. It runs on a thread and runtime of its own, so the test's runtime being
//! busy never slows what goes through it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
                            forward(client, server, token, stop, cuts).await;
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
    token: CancellationToken,
    stop: CancellationToken,
    cuts: Arc<AtomicU64>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = token.cancelled() => {
            cuts.fetch_add(1, Ordering::Relaxed);
        }
        _ = stop.cancelled() => {}
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.current.lock().unwrap().cancel();
    }
}
