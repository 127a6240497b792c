//! Sockets every latchkey server accepts.

/// Accepted connections with Nagle's algorithm off. tonic ignores its own
/// `tcp_nodelay` for a server fed from `serve_with_incoming*`, and with
/// Nagle on every small answer waits for the client's delayed ACK (~40 ms).
/// The cell's client and peer servers and the proxy's servers all take
/// their connections from here.
pub fn nodelay_incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::nodelay_incoming;
    use tokio_stream::StreamExt;

    /// Every accepted socket has Nagle off, or each small answer waits
    /// ~40 ms for the peer's delayed ACK (cell issue 10: serializable
    /// ranges ran at 1.7k/s with Nagle on, 26k/s with it off).
    #[tokio::test]
    async fn every_accepted_socket_has_tcp_nodelay_set() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut incoming = Box::pin(nodelay_incoming(listener));
        for _ in 0..3 {
            let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let accepted = incoming
                .next()
                .await
                .expect("a connection")
                .expect("accepted");
            assert!(accepted.nodelay().expect("read TCP_NODELAY"));
            drop(client);
        }
    }
}
