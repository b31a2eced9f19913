"""Test worker: TLS (or plaintext) over loopback with Python's ssl module.
`server TAG CERT KEY` prints its port, then for every connection handshakes,
reads everything and answers b"ok". `client TAG PORT N BYTES tls|plain` makes N
connections, sends BYTES bytes on each, reads the answer, and prints the
handshake times it measured itself (JSON) after a line on stdin."""
import json
import socket
import ssl
import sys
import threading
import time

role, tag = sys.argv[1], sys.argv[2]

if role == "server":
    cert, key = sys.argv[3], sys.argv[4]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def serve(conn):
        with ctx.wrap_socket(conn, server_side=True) as tls:
            size = int.from_bytes(tls.recv(8), "big")
            while size > 0:
                size -= len(tls.recv(65536))
            tls.sendall(b"ok")

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
else:
    port, n, size, mode = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    sys.stdin.readline()
    handshakes = []
    for _ in range(n):
        raw = socket.create_connection(("127.0.0.1", port))
        if mode == "tls":
            conn = ctx.wrap_socket(raw, do_handshake_on_connect=False)
            t0 = time.perf_counter()
            conn.do_handshake()
            handshakes.append(time.perf_counter() - t0)
            conn.sendall(size.to_bytes(8, "big") + b"x" * size)
            conn.recv(2)
            conn.close()
        else:
            raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
            while raw.recv(65536):
                pass
            raw.close()
    print(json.dumps(handshakes), flush=True)
    sys.stdin.readline()
