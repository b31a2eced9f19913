"""Test worker for TCP: `sink TAG` listens on 0.0.0.0 (run it inside a network
namespace), prints its port and discards whatever arrives. `send TAG HOST PORT`
waits for a line on stdin, then sends bulk data on one connection for SECONDS
(next stdin line), sampling the kernel's own srtt of that socket (TCP_INFO,
tcpi_rtt in µs) every 5 ms, and prints the samples as JSON; repeats per line."""
import json
import socket
import struct
import sys
import time

role, tag = sys.argv[1], sys.argv[2]

if role == "sink":
    listener = socket.create_server(("0.0.0.0", 0))
    print(listener.getsockname()[1], flush=True)
    import threading

    def drain(conn):
        while conn.recv(1 << 20):
            pass

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()
else:
    host, port = sys.argv[3], int(sys.argv[4])
    chunk = b"x" * 16384
    for line in sys.stdin:
        seconds = float(line)
        conn = socket.create_connection((host, port))
        samples, end, next_sample = [], time.monotonic() + seconds, 0.0
        while (now := time.monotonic()) < end:
            conn.send(chunk)
            if now >= next_sample:
                info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                samples.append(struct.unpack_from("I", info, 68)[0])   # tcpi_rtt, µs
                next_sample = now + 0.005
        conn.close()
        print(json.dumps(samples), flush=True)
