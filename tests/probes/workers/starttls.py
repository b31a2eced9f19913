"""Test worker: TLS started after a plaintext exchange on the same connection, as
PostgreSQL's SSLRequest does (the client sends 8 bytes, the server answers "S",
then the TLS handshake). `server TAG CERT KEY` prints its port and serves each
connection so; `client TAG PORT N` makes N such connections after a line on
stdin and prints "done"."""
import socket
import ssl
import sys
import threading

role, tag = sys.argv[1], sys.argv[2]
REQUEST = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")     # PostgreSQL's SSLRequest

if role == "server":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[3], sys.argv[4])
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def serve(conn):
        with conn:
            if conn.recv(8) == REQUEST:
                conn.sendall(b"S")
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(tls.recv(64))

    while True:
        threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()
else:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    sys.stdin.readline()
    for _ in range(int(sys.argv[4])):
        with socket.create_connection(("127.0.0.1", int(sys.argv[3]))) as raw:
            raw.sendall(REQUEST)
            assert raw.recv(1) == b"S"
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(b"ping")
                assert tls.recv(64) == b"ping"
    print("done", flush=True)
    sys.stdin.readline()
